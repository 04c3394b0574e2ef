"""Errors and warnings of heterogeneous placement.

:class:`PlacementError` joins the package's exception family (:class:`byoc_hetero.errors.ByocError`)
and is a ``ValueError``: a placement map, a placed module or a compiled placement that cannot be
honoured. Its message names the op (or rule) and the devices involved.
"""

from __future__ import annotations

from ..errors import ByocError


class PlacementError(ByocError, ValueError):
    """A placement cannot be honoured: unknown or undeclared device, an op whose operands and
    output are not on one device, a kernel compiled for the wrong target, a missing GPU module."""


class PlacementWarning(UserWarning):
    """A placement map entry that had no effect (e.g. it names an op the model does not contain)."""
