"""export_library, then load and run in a fresh process."""

from __future__ import annotations

import numpy as np
import tvm
from conftest import TOLERANCE, run_exported_in_fresh_process

import byoc_hetero as bh
from byoc_hetero.timing import build, random_inputs, relative_error, run


def test_export_and_reload_in_a_fresh_process(tmp_path):
    mod, params = bh.models.small_convnet(batch=2)
    ex = build(bh.partition(mod, params))
    inputs = random_inputs(mod, params)
    want = run(ex, inputs)
    got = run_exported_in_fresh_process(ex, inputs[0], tmp_path)
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
