"""Decisions from measurements (issue 26): the building blocks of the tuner.

- :mod:`.levels`: the protocol every level follows (its units, the choices per unit read from the
  backend, measurement through the timing cache, the decisions applied as backend options);
- :mod:`.knobs`: where a level finds a backend's :class:`~byoc_hetero.rules.Knob` (nothing here
  names a backend);

- :mod:`.cache`: the timing cache on disk, keyed by machine, library versions and the candidate's
  signature; foreign, stale or corrupt files are ignored with a warning;
- :mod:`.measure`: timing one candidate (warm-up, repeats, outliers dropped, median, spread);
- :mod:`.solver`: one choice per region (device × codegen × precision × algorithm) minimising
  time plus the copies the devices imply, within an error budget; exact, or the best so far when
  the budget runs out.
- :mod:`.algorithms`: the algorithm level (each unit of a backend's algorithm knob on the fastest of
  its variants of that level, e.g. direct or Winograd per convolution, timed alone);
- :mod:`.precision`: the precision level (f32, bf16 or int8 per conv2d / dense / matmul, as the
  backend's variants offer them: one search for the fastest mix within an error tolerance, checked
  on held-out inputs, over a plan space: the float choices' node table, or with int8 :mod:`.int8`'s);
- :mod:`.plans`: what the precision level's spaces share (units, a plan's build, the session of
  one tune, one node timed alone, the held-out check, the end-to-end pick);
- :mod:`.int8`: the plan space with int8 among the choices (layers quantized through
  :func:`byoc_hetero.quantize`'s plan, calibrated once, matched to their nodes by content);
- :mod:`.devices`: the device level (each call of the tuned module on a CPU or a GPU, from measured
  or given costs, copies counted; applied with ``bh.place``);
- :mod:`.codegen`: the codegen level (each candidate region offloaded, on llvm, or on another
  backend of ``targets`` (a user's), timed every way with its boundary; applied as
  ``bh.partition``'s ``region_codegen``);
- :mod:`.reuse`: the end-to-end check's figures kept in the cache for an unchanged model and plan;
- :mod:`.progress`: the progress bar on stderr;
- :mod:`.tuner`: ``bh.tune``, the driver: measures, applies the decisions through the backend's
  options, and keeps the tuned module only where it is measured faster end to end.

- :mod:`.options`: the option level (each option a backend declares tunable, per region, on its
  fastest declared value; one that changes numerics only within ``bh.tune``'s tolerance, checked
  against the default; applied as the option's per-region table);
- :mod:`.threads`: the threads level (``threads=True``: each region of a backend with a threads knob
  on the process's thread count or one, timed both ways; applied as the knob's option);
- :mod:`.plan_errors`: the precision level's measured errors (sensitivities, mixes) and end-to-end
  figures in the timing cache, by model, plan and inputs.
"""

from .cache import MachineKey, Timing, TimingCache, TimingCacheWarning, signature
from .devices import CostTable, DeviceReport, DeviceUnit, Measurer
from .measure import robust_timing, time_alternately, time_call
from .plans import PrecisionReport, PrecisionUnit, TuneWarning
from .solver import Choice, Problem, Region, Solution, linear_copy_cost, plan_cost, solve
from .tuner import TuneReport, tune

__all__ = [
    "Choice",
    "CostTable",
    "DeviceReport",
    "DeviceUnit",
    "MachineKey",
    "Measurer",
    "PrecisionReport",
    "PrecisionUnit",
    "Problem",
    "Region",
    "Solution",
    "Timing",
    "TimingCache",
    "TimingCacheWarning",
    "linear_copy_cost",
    "plan_cost",
    "robust_timing",
    "signature",
    "solve",
    "time_alternately",
    "time_call",
    "tune",
    "TuneReport",
    "TuneWarning",
]
