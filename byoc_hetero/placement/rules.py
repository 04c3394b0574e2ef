"""Placement rules: which device runs a call.

What :func:`~byoc_hetero.placement.place` takes is either a *placement map* or a *placement policy*.

A **policy** is one callable taking a :class:`Site` and returning its device (a device string, a
:class:`~.devices.Device` or a ``tvm.runtime.Device``) or None for "no decision" (the fallback
device; an offloaded region stays with its inputs)::

    def policy(site):
        if site.op_name == "relax.nn.conv2d":
            return "cuda"
        return "cpu" if site.op_name == "my.cpu_only_op" else None

A **map** is a mapping (or a sequence of pairs) from a *rule key* to a device. Keys:

* an **op name**: ``"relax.nn.conv2d"`` (``"nn.conv2d"`` works too), the callee of ``call_tir`` /
  ``call_dps_packed`` / ``call_pure_packed`` (``"my.cpu_only_op"``), an offloaded region's codegen
  name (``"onednn"``, or its alias ``"byoc_hetero"``), symbol or composite name
  (``"onednn.conv2d_bias_relu"``);
* a **dataflow pattern** (``tvm.relax.dpl``), matched against the call with the function's bindings
  visible (so ``is_op("relax.nn.relu")(is_op("relax.nn.conv2d")(wildcard(), wildcard()))`` works);
* a **callable** taking a :class:`Site` and returning true for calls it places, e.g.
  ``lambda s: s.op_name == "relax.nn.conv2d" and s.index == 0`` (only the first conv).

Rules are tried in map order; the first that matches decides. An offloaded region is one call:
an op name inside it does not place it (``"relax.nn.conv2d"`` warns that it matched nothing when
every conv2d is inside regions); name the region (``"onednn"``, its composite names) or use a
callable on :attr:`Site.contained_ops`. A region no rule places stays on the device of its inputs
(a CPU device for a CPU runtime such as ``byoc_hetero``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern

from ..errors import PlacementError
from ..targets import canonical_name
from .devices import Device, DeviceLike, parse_device

RuleKey = str | DFPattern | Callable[["Site"], bool]
PlacementMap = Mapping[RuleKey, DeviceLike] | Sequence[tuple[RuleKey, DeviceLike]]
#: a function deciding every call's device: ``policy(site) -> device or None`` (None: no decision)
PlacementPolicy = Callable[["Site"], DeviceLike | None]

_WHAT_A_MAP_IS = ("a placement map is a dict {rule: device}, a list of (rule, device) pairs, or a policy "
                  "function site -> device or None (a rule is an op name, a dataflow pattern or a "
                  "callable site -> bool)")


@dataclass
class Site:
    """A call being placed, with its context. Attributes not listed here are the call's own
    (``site.op``, ``site.args``, ``site.attrs``), so a rule written for a ``relax.Call`` works."""

    call: relax.Call
    #: the name rules match: op name, or callee of call_tir/call_dps_packed, or called function
    op_name: str
    #: how many earlier calls with the same ``op_name`` the function has (0: the first)
    index: int
    #: the name of the variable the call is bound to
    name: str
    #: the function being placed
    function: str
    #: the codegen name of an offloaded region (``"onednn"``), None for other calls
    region: str | None = None
    #: op names inside an offloaded region (``"relax.nn.conv2d"``, ...)
    contained_ops: tuple[str, ...] = ()
    #: further names the call answers to: region symbol, codegen and composite names
    aliases: tuple[str, ...] = ()

    def __getattr__(self, item):
        if item == "call":  # not yet set (copy/pickle): avoid recursion
            raise AttributeError(item)
        return getattr(self.call, item)

    def names(self) -> tuple[str, ...]:
        return (self.op_name, *self.aliases)


def _normalize_name(name: str) -> str:
    """``"nn.conv2d"`` → ``"relax.nn.conv2d"`` when that is a registered op; a backend alias (or a
    composite name under one) → the backend's name (``"byoc_hetero"`` → ``"onednn"``); else
    unchanged."""
    if name.startswith("relax."):
        return name
    head, dot, rest = name.partition(".")
    if canonical_name(head) != head:
        return canonical_name(head) + dot + rest
    try:
        tvm.ir.Op.get("relax." + name)
    except Exception:  # noqa: BLE001  (TVM raises its own error types for unknown ops)
        return name
    return "relax." + name


def _label(key) -> str:
    if isinstance(key, str):
        return repr(key)
    if isinstance(key, DFPattern):
        return f"pattern {key}"
    return f"callable {getattr(key, '__qualname__', None) or getattr(key, '__name__', repr(key))}"


@dataclass
class Rule:
    """One entry of a placement map."""

    key: RuleKey
    device: Device
    name: str | None = None  # the normalized op name for string keys
    matched: int = 0
    sites: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return _label(self.key)

    def matches(self, site: Site, var2val) -> bool:
        """Whether the rule names this call directly."""
        if self.name is not None:
            return self.name in site.names()
        if isinstance(self.key, DFPattern):
            return bool(self.key.match(site.call, var2val))
        try:
            return bool(self.key(site))
        except Exception as err:  # noqa: BLE001  (a user callable: report it with the rule)
            raise PlacementError(
                f"placement rule {self.label} raised {type(err).__name__}: {err} "
                f"(on {site.op_name} bound to {site.name!r} in {site.function})"
            ) from err


class PlacementRules:
    """A parsed placement map (ordered rules, the first match wins) or placement policy."""

    def __init__(self, mapping: PlacementMap | PlacementPolicy | None):
        self.rules: list[Rule] = []
        #: the policy function, when the map is one
        self.policy: PlacementPolicy | None = None
        #: devices the policy returned, in first-seen order, with the first call that got each
        self.policy_devices: dict[Device, str] = {}
        if mapping is None:
            return
        if isinstance(mapping, Mapping):
            items = list(mapping.items())
        elif isinstance(mapping, DFPattern):
            raise PlacementError(f"a dataflow pattern alone is not a placement map: write {{pattern: device}}; "
                                 f"{_WHAT_A_MAP_IS}")
        elif callable(mapping):
            self.policy = mapping
            return
        elif isinstance(mapping, Sequence) and not isinstance(mapping, str | bytes):
            items = list(mapping)
        else:
            raise PlacementError(f"{_WHAT_A_MAP_IS}; got a {type(mapping).__name__}: {mapping!r}")
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise PlacementError(f"placement map entries are (rule, device) pairs, got {item!r}")
            key, dev = item
            if isinstance(key, str):
                if not key.strip():
                    raise PlacementError("placement rule with an empty op name")
                rule = Rule(key, _parse(dev, key), name=_normalize_name(key.strip()))
            elif isinstance(key, DFPattern) or callable(key):
                rule = Rule(key, _parse(dev, key))
            else:
                raise PlacementError(
                    f"placement rule {key!r}: a rule is an op name, a dataflow pattern or a callable"
                )
            self.rules.append(rule)

    @property
    def label(self) -> str:
        """How messages name the policy."""
        return "policy " + _label(self.policy).removeprefix("callable ") if self.policy is not None else "map"

    def devices(self) -> list[Device]:
        """Devices the rules name (or the policy returned so far), in order, each once."""
        seen: list[Device] = []
        for device in [*(rule.device for rule in self.rules), *self.policy_devices]:
            if device not in seen:
                seen.append(device)
        return seen

    def named_by(self) -> list[tuple[str, Device]]:
        """(what named it, device) for every device the rules or the policy chose."""
        named = [(f"placement rule {rule.label}", rule.device) for rule in self.rules]
        named += [(f"placement {self.label} (for {site})", dev) for dev, site in self.policy_devices.items()]
        return named

    def lookup(self, site: Site, var2val) -> Device | None:
        """The device the map or policy gives ``site``; None when nothing decides it (the caller then
        uses the fallback device, or for an offloaded region the device of its inputs)."""
        if self.policy is not None:
            return self._ask_policy(site)
        chosen = next((r for r in self.rules if r.matches(site, var2val)), None)
        if chosen is None:
            return None
        chosen.matched += 1
        chosen.sites.append(f"{site.function}:{site.name}")
        return chosen.device

    def _ask_policy(self, site: Site) -> Device | None:
        where = f"{site.op_name} bound to {site.name!r} in {site.function}"
        try:
            answer = self.policy(site)
        except Exception as err:  # noqa: BLE001  (a user function: report it with the call)
            raise PlacementError(f"placement {self.label} raised {type(err).__name__}: {err} (on {where})") from err
        if answer is None:
            return None
        try:
            device = parse_device(answer)
        except PlacementError as err:
            raise PlacementError(f"placement {self.label} on {where}: {err}") from None
        self.policy_devices.setdefault(device, f"{site.function}:{site.name}")
        return device

    def unused(self) -> list[Rule]:
        """Rules of a map that matched no call."""
        return [r for r in self.rules if r.matched == 0]


def _parse(dev: DeviceLike, key) -> Device:
    try:
        return parse_device(dev)
    except PlacementError as err:
        raise PlacementError(f"placement rule {_label(key)}: {err}") from None
