"""The package version (imported by the caches, whose keys hold it, without importing the API)."""

__version__ = "0.1.0"
