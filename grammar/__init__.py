"""tcdsl.grammar: the Lark grammar of TC and the parser that turns text into the AST.

Installed as ``tcdsl.grammar`` from the top-level ``grammar/`` folder; it imports only ``tcdsl.core``.
"""

from .parser import is_short_form, parse, parse_statements

__all__ = ["parse", "parse_statements", "is_short_form"]
