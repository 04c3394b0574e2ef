"""The tuner's decisions of two checkouts of byoc-hetero on one model, from the same timing cache.

    python3 bench/tune_decisions.py --a /work/main --b . --model zoo:resnet50 --small \
        --precisions f32 bf16 int8

Checkout A tunes the model with a new timing cache (cold), then again from it (warm); checkout B
tunes it from a copy of that cache, adopted as its own (the cache's key names the package's
sources, so a second checkout would otherwise ignore it as stale). With every timing and error read
from the same figures, the decisions must be equal where the tuning logic is: codegen per region,
algorithm per convolution, the precision level's kept plan and each unit's choice, and the plan
returned. Each run is its own process importing ``byoc_hetero`` from its tree (each tree needs its
built extension, ``byoc_hetero/_C*.so``). Prints both sets and whether they match, and each run's
report with ``--report``.

``--native`` makes the precision choices run on a CPU that lacks them natively, as
tests/test_tune_zoo.py does: ``BYOC_HETERO_INT8=saturating`` keeps oneDNN's int8 kernels below VNNI,
and the backend's bf16 answer is patched to "runs as asked" (the runtime then computes the bf16
nodes in float32): the level's choices, sensitivities and search then run, which a CPU without
VNNI / bf16 would otherwise skip. ``--tolerance`` sets the error tolerance (default 5e-2).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile

WORKER = r"""
import json, os, sys, warnings
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import numpy as np
import byoc_hetero as bh
from byoc_hetero.tune.cache import MachineKey

model, small, cache, adopt = sys.argv[2], sys.argv[3] == "1", sys.argv[4], sys.argv[5] == "1"
precisions = tuple(sys.argv[6].split(","))
tolerance = float(sys.argv[7])
if os.environ.get("TUNE_DECISIONS_BF16") == "1":  # --native: bf16 choices built (computed float32 below bf16)
    from byoc_hetero.backends.onednn import precision as backend_precision
    backend_precision.effective_precision = lambda p: (p, "")
if adopt:  # the other checkout's cache as this one's: same machine, libraries and runtime build
    doc = json.load(open(cache))
    doc["machine"]["sources"] = MachineKey.current().sources
    json.dump(doc, open(cache, "w"))
if model.startswith("zoo:"):
    from zoo_models import build
    zm = build(model[4:], small=small)
    mod, params = bh.from_torch(zm.module, zm.inputs)
    given = [t.numpy() for t in zm.inputs]
else:
    mod, params = getattr(bh.models, model)()
    given = [np.zeros([int(d) for d in mod["main"].params[0].ty.shape.values], "float32")]
rng = np.random.default_rng(3)
# float inputs drawn at random, integer ones (token ids, masks) as the model was exported with
cal = [[rng.standard_normal(x.shape).astype(x.dtype) if x.dtype == np.float32 else x for x in given]
       for _ in range(4)]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    tuned, report = bh.tune(mod, params, precisions=precisions, tolerance=tolerance if len(precisions) > 1 else None,
                            calibration=cal if len(precisions) > 1 else None, cache=cache, guard_rounds=1, repeat=3)
rep = report.precision
print(json.dumps({
    "codegen": [[str(d.region), str(d.chosen)] for d in report.codegen.decisions],
    "algorithms": [[str(d.site), d.chosen] for d in report.algorithms],
    "precision kept": rep.kept if rep else None,
    "units": [[u.name, u.chosen] for u in rep.units] if rep else [],
    "notes": [n for n in (rep.notes if rep else []) if "skipped" in n],
    "returned": report.kept,
    # the kept table in unit order (node keys by content since session 14, by index before: not compared)
    "kept table": [(rep.plan(rep.kept).table if rep.plan(rep.kept) else {}).get(k, "f32")
                   for u in rep.units for k in u.keys] if rep else [],
    "cache": [report.cache_hits, report.cache_misses],
    "report": str(report).splitlines(),
}))
"""


def run(tree: str, model: str, small: bool, cache: str, adopt: bool, precisions: list[str], tolerance: float,
        native: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="1")
    if native:
        env.update(BYOC_HETERO_INT8="saturating", BYOC_HETERO_ATTENTION="fused", TUNE_DECISIONS_BF16="1")
    proc = subprocess.run([sys.executable, "-c", WORKER, os.path.abspath(tree), model, "1" if small else "0", cache,
                           "1" if adopt else "0", ",".join(precisions), repr(tolerance)], capture_output=True,
                          text=True, env=env, cwd=tree, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--model", default="zoo:resnet50")
    ap.add_argument("--small", action="store_true", help="the zoo model's small config")
    ap.add_argument("--precisions", nargs="+", default=["f32", "bf16", "int8"])
    ap.add_argument("--tolerance", type=float, default=5e-2)
    ap.add_argument("--native", action="store_true", help="int8 / bf16 choices run below VNNI / native bf16")
    ap.add_argument("--report", action="store_true", help="print each run's report too")
    ap.add_argument("--cache", help="start from this timing cache file (A's first run is then warm too)")
    args = ap.parse_args()
    folder = tempfile.mkdtemp()
    cache_a, cache_b = os.path.join(folder, "a.json"), os.path.join(folder, "b.json")
    if args.cache:
        shutil.copy(args.cache, cache_a)
    again = (args.tolerance, args.native)
    cold = run(args.a, args.model, args.small, cache_a, bool(args.cache), args.precisions, *again)
    warm = run(args.a, args.model, args.small, cache_a, False, args.precisions, *again)
    shutil.copy(cache_a, cache_b)
    other = run(args.b, args.model, args.small, cache_b, True, args.precisions, *again)
    print(f"cache of A: {cache_a}")
    reports = {}
    for name, got in (("A first", cold), ("A warm", warm), ("B from A's cache", other)):
        report = reports[name] = got.pop("report")
        print(f"{name}: {json.dumps(got)}")
        if args.report:
            print("\n".join(report))
    keys = ("codegen", "algorithms", "precision kept", "units", "kept table", "returned")
    same = all(warm[k] == other[k] for k in keys)
    print(f"decisions equal (A warm vs B from A's cache): {same}")
    if not same:
        print("differ: " + ", ".join(k for k in keys if warm[k] != other[k]))
    lines = list(difflib.unified_diff(reports["A warm"], reports["B from A's cache"], "A warm", "B", lineterm=""))
    print("reports equal (A warm vs B)" if not lines else "reports differ (A warm vs B):\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
