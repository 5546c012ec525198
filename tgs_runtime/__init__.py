"""TGS: transparent GPU sharing for containers (see ARCHITECTURE.md)."""

__version__ = "0.1.0"
