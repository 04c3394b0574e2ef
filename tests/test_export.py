"""export_library, then load and run in a fresh process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import tvm
from conftest import TOLERANCE

import byoc_hetero as bh
from byoc_hetero.timing import build, random_inputs, relative_error, run


def test_export_and_reload_in_a_fresh_process(tmp_path):
    mod, params = bh.models.small_convnet(batch=2)
    ex = build(bh.partition(mod, params))
    inputs = random_inputs(mod, params)
    want = run(ex, inputs)
    lib = tmp_path / "model.so"
    ex.export_library(str(lib))
    np.save(tmp_path / "x.npy", inputs[0])
    script = textwrap.dedent(
        f"""
        import numpy as np, tvm
        from tvm import relax
        import byoc_hetero  # registers the loader of the offloaded regions
        lib = tvm.runtime.load_module({str(lib)!r})
        vm = relax.VirtualMachine(lib, tvm.cpu())
        x = np.load({str(tmp_path / "x.npy")!r})
        np.save({str(tmp_path / "y.npy")!r}, vm["main"](tvm.runtime.tensor(x)).numpy())
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "y.npy")
    assert relative_error(got, want) <= TOLERANCE


def test_wrong_input_shape_or_dtype_raises():
    mod, params = bh.models.small_convnet()
    ex = build(bh.partition(mod, params))
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    import pytest

    with pytest.raises(Exception, match="(?i)shape|1, 3, 16, 16|16"):
        vm["main"](tvm.runtime.tensor(np.zeros((1, 3, 8, 8), "float32")))
    with pytest.raises(Exception, match="(?i)dtype|float32|float64"):
        vm["main"](tvm.runtime.tensor(np.zeros((1, 3, 16, 16), "float64")))
    # still usable afterwards
    assert vm["main"](tvm.runtime.tensor(np.zeros((1, 3, 16, 16), "float32"))).numpy().shape == (1, 10)
