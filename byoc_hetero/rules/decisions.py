"""Decisions of one partition run: why candidate calls were not offloaded, and rule errors.

Each stage invocation works with its own :class:`DecisionLog`, seeded from the module it is given
(``byoc_hetero.rejections``, written by the previous stage) and written back onto the module it
returns. Nothing is kept per process, so two partitions in two threads never see each other's
reasons; reports read them from the module (:func:`rejections`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .._relax import describe, op_name
from ..errors import ByocError

_log = logging.getLogger("byoc_hetero.rules")

DECISIONS_ATTR = "byoc_hetero.rejections"
"""Module attribute where the stages keep why candidate calls were not offloaded."""


@dataclass(frozen=True)
class Rejection:
    """A rule matched a call but said no (its check, or the cost gate)."""

    rule: str
    op: str
    reason: str
    value: str = ""  # the call's result, e.g. ``float32[1, 64, 56, 56]``


@dataclass
class DecisionLog:
    """Rejections (and the first rule error) recorded by one stage of one partition run."""

    rejections: list[Rejection] = field(default_factory=list)
    error: ByocError | None = None

    @classmethod
    def from_module(cls, mod: tvm.IRModule) -> "DecisionLog":
        """A log holding the rejections earlier stages recorded on ``mod``."""
        return cls(rejections(mod))

    def add(self, rule: str, call: relax.Call, reason: str) -> None:
        """Record that ``rule`` matched ``call`` and rejected it for ``reason``."""
        op = op_name(call) or str(call.op)
        self.rejections.append(Rejection(rule, op, reason, describe(call)))
        _log.info("rule %s rejected %s: %s", rule, op, reason)

    def fail(self, err: ByocError) -> None:
        """Keep a rule's error raised inside a TVM pass (TVM re-wraps Python errors as its own)."""
        if self.error is None:
            self.error = err

    def raise_pending(self) -> None:
        """Re-raise the first error :meth:`fail` kept, with its own type."""
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    def attach(self, mod: tvm.IRModule) -> tvm.IRModule:
        """``mod`` carrying this log's rejections (attribute :data:`DECISIONS_ATTR`)."""
        self.raise_pending()
        records = [{"rule": r.rule, "op": r.op, "reason": r.reason, "value": r.value}
                   for r in self.rejections]
        return mod.with_attr(DECISIONS_ATTR, records)


def rejections(mod: tvm.IRModule) -> list[Rejection]:
    """The rejections the partition stages recorded on ``mod`` (empty before the first stage)."""
    if mod.attrs is None or DECISIONS_ATTR not in mod.attrs:
        return []
    return [Rejection(str(d["rule"]), str(d["op"]), str(d["reason"]), str(d["value"]))
            for d in mod.attrs[DECISIONS_ATTR]]


def latest_rejection(found: list[Rejection], op: str, value: str) -> Rejection | None:
    """The latest rejection of a call of ``op`` whose result is ``value``, if any."""
    for rej in reversed(found):
        if rej.op == op and rej.value == value:
            return rej
    return None
