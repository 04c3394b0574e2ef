"""The main job: VGG-11 through the four stages, then offloaded vs llvm-only latency."""

from __future__ import annotations

import time

from . import models
from ._relax import region_table
from .profile import op_profile
from .rules import default_target
from .stages import bind_params, stages
from .timing import build, median_latency, random_inputs, relative_error, run


STAGE_JOB = {
    "MergeComposite": "pattern rules group ops into composites (candidates, still run by TVM)",
    "AnnotateTarget": "op rules make one-op composites; each composite is marked with its target",
    "MergeCompilerRegions": "neighbouring composites of one target merge into regions (outlined functions)",
    "PartitionGraph": "each region goes to its codegen and becomes one call of a runtime module",
}
"""What each stage does, printed above what it changed."""


def demo(image_size: int = 224, repeat: int = 3, out=print) -> dict[str, float]:
    """Partition VGG-11 stage by stage (what each stage changed, and the op profile after it),
    build, check, time.

    Returns the measured figures (seconds and the relative error against llvm-only).
    """
    mod, params = models.vgg11(batch=1, image_size=image_size)
    inputs = random_inputs(mod, params)
    out(f"VGG-11, batch 1, {image_size}x{image_size}, random weights\n")
    bound = bind_params(mod, params)
    m = bound
    out("== input module")
    before = op_profile(m)
    out(str(before))
    for stage in stages():
        start = time.perf_counter()
        m = stage(m)
        now = op_profile(m)
        out(f"\n== after {stage.info.name} ({time.perf_counter() - start:.2f} s): {STAGE_JOB.get(stage.info.name, '')}")
        changes = now.changes(before)
        if stage.info.name == "PartitionGraph":
            changes.append(f"{len(region_table(m))} region(s) now runtime modules of the codegen "
                           "(bh.report(m) shows their graphs)")
        out("changed: " + "\n         ".join(changes or ["no change in where ops run"]))
        if now.counts != before.counts or now.regions != before.regions:
            out(str(now))
        before = now
    regions = op_profile(m).regions.get(default_target(), 0)
    out(f"\noffloaded regions: {regions}")

    start = time.perf_counter()
    ex_off = build(m)
    t_build_off = time.perf_counter() - start
    start = time.perf_counter()
    ex_ref = build(bound)
    t_build_ref = time.perf_counter() - start
    out(f"build: offloaded {t_build_off:.1f} s, llvm-only {t_build_ref:.1f} s")

    err = relative_error(run(ex_off, inputs), run(ex_ref, inputs))
    out(f"max relative error offloaded vs llvm-only: {err:.2e}")
    t_off = median_latency(ex_off, inputs, repeat=max(repeat, 5))
    t_ref = median_latency(ex_ref, inputs, repeat=repeat)
    out(f"median latency: offloaded {t_off * 1e3:.1f} ms, llvm-only {t_ref * 1e3:.1f} ms "
        f"({t_ref / t_off:.1f}x faster)")
    return {"offloaded_s": t_off, "llvm_s": t_ref, "relative_error": err, "regions": regions}
