"""``byoc-hetero serve lib.so --model NAME:VERSION=PATH``: starts, answers like a direct run, rejects a bad
request (400) and a large one (413), serves both models by name over KServe v2, stops on SIGTERM.

Skipped where Ray Serve is not installed. Its own file: the command starts its own Ray instance, which
must not meet the one tests/test_serve.py keeps for its module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.serve")

import tvm  # noqa: E402

import byoc_hetero as bh  # noqa: E402
from byoc_hetero import serve as bs  # noqa: E402
from conftest import HANG_GUARD_S  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _serve(lib, port: int, log):
    """``byoc-hetero serve`` started until its node registers with Ray (conftest.start_serving: Ray's fixed
    30 s wait for the raylet ran out under the full suite's load, issue 35); the process, once it prints the
    line that it serves. Each wait ends on its event (a line, the process's exit); HANG_GUARD_S is a guard
    against a hang only."""
    guard = time.monotonic() + HANG_GUARD_S
    while True:
        log.seek(0)
        log.truncate()
        proc = subprocess.Popen([sys.executable, "-m", "byoc_hetero", "serve", str(lib), "--model", f"other:3={lib}",
                                 "--port", str(port), "--max-request-mb", "0.01"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        line = ""
        while "serving" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        if "serving" in line:
            return proc, line
        # a failed start leaves its Ray processes (GCS server, dashboard, monitor) behind in its session: end them
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.seek(0)
        error = log.read()
        assert "timed out during startup" in error and time.monotonic() < guard, \
            f"byoc-hetero serve exited before serving: {error[-3000:]}"


def test_serve_command(tmp_path):
    mod, params = bh.models.mlp(batch=2, features=16, hidden=(8,))
    lib = bs.export(bh.partition(mod, params), tmp_path / "mlp.so")
    direct = bh.vm(tvm.runtime.load_module(str(lib)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "serve.err", "w+") as log:
        proc, line = _serve(lib, port, log)
        try:
            assert f"http://127.0.0.1:{port}/" in line
            x = np.random.default_rng(0).standard_normal((2, 16)).astype("float32")
            answer = bs.post(f"http://127.0.0.1:{port}/", x, timeout=HANG_GUARD_S)
            assert answer.status == 200, answer.error
            np.testing.assert_allclose(answer.output, direct["main"](x).numpy(), rtol=1e-5, atol=1e-5)
            bad = bs.post(f"http://127.0.0.1:{port}/", x[:, :15].copy(), timeout=HANG_GUARD_S)
            assert bad.status == 400 and "expected shape [2, 16], got [2, 15]" in bad.error
            big = bs.post(f"http://127.0.0.1:{port}/", np.zeros((2, 2000), "float32"), timeout=HANG_GUARD_S)
            assert big.status == 413 and "max_request_bytes=10485" in big.error  # > 0.01 MiB
            for route, code in (("v2/models/mlp", 200), ("v2/models/other/versions/3/ready", 200),
                                ("v2/models/other/versions/1", 404)):  # the stem names the first; --model the other
                assert _get(f"http://127.0.0.1:{port}/{route}") == code, route
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                assert proc.wait(timeout=HANG_GUARD_S) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()


def _get(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=HANG_GUARD_S) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code
