"""Named Relax rewrites, one module each (what it rewrites and why in its docstring)."""

from .checked_take import checked_take

__all__ = ["checked_take"]
