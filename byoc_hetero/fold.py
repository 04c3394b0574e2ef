"""Kept for callers of ``byoc_hetero.fold``: the pass lives in :mod:`byoc_hetero.passes.fold_int_constants`."""

from .passes.fold_int_constants import MAX_ELEMENTS, MAX_INDEX_ELEMENTS, fold_int_constants

__all__ = ["MAX_ELEMENTS", "MAX_INDEX_ELEMENTS", "fold_int_constants"]
