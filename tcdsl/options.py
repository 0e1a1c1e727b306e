"""Mapping options, at their public path: ``tcdsl.options`` re-exports ``MappingOptions``, which lives
in the bottom layer (``tcdsl.core.options``) because the schedule and GPU mapping stages read it."""

from .core.options import FUSION, MappingOptions, fusion_for

__all__ = ["FUSION", "MappingOptions", "fusion_for"]
