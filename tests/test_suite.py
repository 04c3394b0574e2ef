"""The suite's own machinery in tests/conftest.py: which ISA-capped int8 runs a CPU takes, and the xdist groups.

The capped runs are decided from the ISA oneDNN runs under each cap (``conftest.isa_under``, asked in a
subprocess); here that answer is given for CPUs this project's machine is not (a VNNI, bf16 or AMX CPU may be
CI's), so that what such a machine runs is checked where it cannot be run.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import conftest
from conftest import SERVE_GROUP, SERVE_MODULES, isa_cap_skip_reason, xdist_group

#: the caps of tests/test_int8_zoo.py (ISA_CAPS) and of tests/test_fuzz.py's capped run (CAPPED_PATHS)
ZOO_CAPS = ("", "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX2_VNNI")
FUZZ_CAPS = ("", "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX2_VNNI")

#: per CPU: its own oneDNN ISA, what oneDNN runs under each cap, and the caps the int8 tests then run
CPUS = {
    "sapphire_rapids": ("avx512_core_amx",
                        {"AVX2": "avx2", "AVX512_CORE": "avx512_core", "AVX512_CORE_VNNI": "avx512_core_vnni",
                         "AVX512_CORE_BF16": "avx512_core_bf16", "AVX2_VNNI": "avx2_vnni"},
                        ("", "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX2_VNNI")),
    "zen4": ("avx512_core_bf16",
             {"AVX2": "avx2", "AVX512_CORE": "avx512_core", "AVX512_CORE_VNNI": "avx512_core_vnni",
              "AVX512_CORE_BF16": "avx512_core_bf16", "AVX2_VNNI": "avx2"},
             ("", "AVX2", "AVX512_CORE")),
    "zen5": ("avx512_core_bf16",  # Zen 4 plus AVX-VNNI: AVX2_VNNI is a path of its own (session 14's machine)
             {"AVX2": "avx2", "AVX512_CORE": "avx512_core", "AVX512_CORE_VNNI": "avx512_core_vnni",
              "AVX512_CORE_BF16": "avx512_core_bf16", "AVX2_VNNI": "avx2_vnni"},
             ("", "AVX2", "AVX512_CORE", "AVX2_VNNI")),
    "ice_lake": ("avx512_core_vnni",
                 {"AVX2": "avx2", "AVX512_CORE": "avx512_core", "AVX512_CORE_VNNI": "avx512_core_vnni",
                  "AVX512_CORE_BF16": "avx512_core_vnni", "AVX2_VNNI": "avx2"},
                 ("", "AVX2", "AVX512_CORE")),
    "skylake_sp": ("avx512_core",
                   {"AVX2": "avx2", "AVX512_CORE": "avx512_core", "AVX512_CORE_VNNI": "avx512_core",
                    "AVX512_CORE_BF16": "avx512_core", "AVX2_VNNI": "avx2"},
                   ("", "AVX2")),
}


@pytest.mark.parametrize("cpu", CPUS)
def test_int8_caps_run_once_per_distinct_kernel_set(cpu, monkeypatch):
    """A cap runs where the CPU can emulate it and no other run takes the same int8 kernels: the CPU's own
    ISA (the uncapped run), or AVX512_CORE_VNNI for AVX512_CORE_BF16 (conftest.INT8_SAME_KERNELS)."""
    own, under, want = CPUS[cpu]
    monkeypatch.setattr(conftest, "isa_under", under.__getitem__)
    monkeypatch.setattr(conftest.bh._C, "isa", lambda: own)
    assert tuple(c for c in ZOO_CAPS if isa_cap_skip_reason(c, ZOO_CAPS) is None) == want
    assert tuple(c for c in FUZZ_CAPS if isa_cap_skip_reason(c, FUZZ_CAPS) is None) == \
        tuple(c for c in want if c in FUZZ_CAPS)
    if cpu == "sapphire_rapids":
        assert "AVX512_CORE_VNNI, which runs here" in isa_cap_skip_reason("AVX512_CORE_BF16", ZOO_CAPS)
        # without the VNNI cap among the test's caps, the bf16 cap is the only run of those kernels
        assert isa_cap_skip_reason("AVX512_CORE_BF16", ("", "AVX512_CORE_BF16")) is None
    if cpu in ("zen4", "zen5"):
        assert "int8 kernels of this CPU's own ISA avx512_core_bf16" in isa_cap_skip_reason("AVX512_CORE_VNNI")


def test_every_test_has_a_group_and_the_serving_modules_share_one(request):
    """Each collected test carries an xdist group (its module's, or the serving group), so that
    ``--dist loadgroup`` keeps a module in one worker."""
    for item in request.session.items:
        mark = item.get_closest_marker("xdist_group")
        assert mark is not None and mark.args, item.nodeid
    for name in SERVE_MODULES:
        assert xdist_group(SimpleNamespace(path=Path("tests") / name)) == SERVE_GROUP
    assert xdist_group(SimpleNamespace(path=Path("tests") / "test_rules.py")) == "test_rules"
