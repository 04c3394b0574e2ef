"""byoc_hetero.serve: a local Ray Serve app on 127.0.0.1, answers against a direct run, bad requests as
HTTP 400, dynamic batching, a replica killed mid-load. Skipped where Ray Serve is not installed.

One Ray instance serves the whole module (starting Ray takes most of the time); every wait is bounded.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("ray.serve")
torch = pytest.importorskip("torch")

import tvm  # noqa: E402

import byoc_hetero as bh  # noqa: E402
from byoc_hetero import serve as bs  # noqa: E402

REPLICAS = 2
_STARTUP_S: list[float] = []  # how long the fixture's start took on this machine, under its present load


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """A small CNN with a symbolic batch (declared 1..64), partitioned and exported for serving."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 10)).eval()
    n = torch.export.Dim("N", min=1, max=64)
    mod, params = bh.from_torch(net, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: n},))
    path = bs.export(bh.partition(mod, params), tmp_path_factory.mktemp("serve") / "cnn.so")
    direct = bh.vm(tvm.runtime.load_module(str(path)))
    return path, lambda x: direct["main"](x).numpy()


@pytest.fixture(scope="module")
def served(library):
    path, _ = library
    port = _free_port()
    began = time.monotonic()
    _start_until_the_node_registers(path, port)
    _STARTUP_S.append(time.monotonic() - began)
    yield f"http://127.0.0.1:{port}/"
    bs.shutdown()
    import ray

    assert not ray.is_initialized()


def _start_until_the_node_registers(path, port: int, starts: int = 3) -> None:
    """``bs.start`` of the module's app. Ray waits a fixed 30 s for its new node to register with the GCS
    (``raylet_start_wait_time_s`` in ray/_private/node.py, not configurable) and raises "The current node
    timed out during startup"; under the full suite's load on 2 cores the raylet took longer (issue 35).
    The event the fixture needs is that registration, so a start that failed only on Ray's fixed wait is
    shut down and made again, at most ``starts`` times; any other error is raised at once."""
    import ray

    for attempt in range(starts):
        try:
            bs.start(bs.app(path, replicas=REPLICAS, cpus=1, batch=True, max_batch_rows=16, batch_wait_s=0.05),
                     port=port, num_cpus=REPLICAS + 1)
            return
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for this
            if "timed out during startup" not in str(err) or attempt == starts - 1:
                raise
            ray.shutdown()


def _inputs(seed: int, rows: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 3, 8, 8)).astype("float32")


def test_answers_match_a_direct_run(library, served):
    _, direct = library
    xs = [_inputs(i, 1 + i % 3) for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda x: bs.post(served, x), xs))
    for x, answer in zip(xs, answers):
        assert answer.status == 200, answer.error
        np.testing.assert_allclose(answer.output, direct(x), rtol=1e-5, atol=1e-5)


def test_concurrent_requests_are_batched(library, served):
    _, direct = library
    for volley in range(3):  # batching depends on arrival times: a few volleys, bounded
        xs = [_inputs(100 + i, 1) for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda x: bs.post(served, x), xs))
        for x, answer in zip(xs, answers):
            assert answer.status == 200, answer.error
            np.testing.assert_allclose(answer.output, direct(x), rtol=1e-5, atol=1e-5)
        if max(a.batch_rows for a in answers) > 1:
            return
    pytest.fail("48 concurrent one-row requests never shared a call")


@pytest.mark.parametrize("body, needle", [
    (np.zeros((2, 3, 9, 8), "float32"), "expected shape [s"),
    (np.zeros((2, 3, 8, 8), "float64"), "expected dtype float32, got float64"),
    (np.zeros((65, 3, 8, 8), "float32"), "outside its declared range [1, 64]"),
    (np.zeros((17, 3, 8, 8), "float32"), "more than max_batch_rows=16"),
])
def test_bad_requests_get_the_input_error_as_400(library, served, body, needle):
    answer = bs.post(served, body)
    assert answer.status == 400 and needle in answer.error, answer
    x = _inputs(7, 2)  # the replica is alive and answers right
    good = bs.post(served, x)
    assert good.status == 200
    np.testing.assert_allclose(good.output, library[1](x), rtol=1e-5, atol=1e-5)


def test_unreadable_bodies_are_400(served):
    import urllib.error
    import urllib.request

    for data, ctype in ((b"hello", "text/plain"), (b"{\"x\": 1}", "application/json")):
        req = urllib.request.Request(served, data=data, headers={"content-type": ctype})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=60)
        assert err.value.code == 400 and b"request:" in err.value.read()


def test_json_requests(library, served):
    import json
    import urllib.request

    x = _inputs(3, 2)
    req = urllib.request.Request(served, data=json.dumps({"inputs": [x.tolist()]}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as reply:
        doc = json.loads(reply.read())
    assert doc["shape"] == [2, 10] and doc["dtype"] == "float32"
    np.testing.assert_allclose(np.asarray(doc["outputs"][0], "float32"), library[1](x), rtol=1e-5, atol=1e-5)


def test_replica_threads_come_from_its_cpu_budget(served):
    import json
    import urllib.request

    with urllib.request.urlopen(served + "info", timeout=60) as reply:
        info = json.loads(reply.read())
    assert info["cpus"] == 1 and info["runtime_threads"] == 1
    assert info["env"] == {k: "1" for k in bs.THREAD_ENV}


def test_requests_are_bounded_and_dead_replicas_noticed_fast(served):
    """The proxy bounds every request (a 408 instead of a request held until the client gives up) and the
    controller health-checks replicas every bs.HEALTH_CHECK_PERIOD_S (it replaces a dead one only then)."""
    import ray

    controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    details = ray.get(controller.get_serve_instance_details.remote(), timeout=60)
    assert details["http_options"]["request_timeout_s"] == bs.REQUEST_TIMEOUT_S
    deployment = details["applications"]["byoc_hetero"]["deployments"]["byoc_hetero"]
    assert deployment["deployment_config"]["health_check_period_s"] == bs.HEALTH_CHECK_PERIOD_S


def _replica_names() -> set[str]:
    import ray

    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::")}


def _patience_s() -> float:
    """How long a client waits for the proxy's answer: the proxy's own bound (bs.REQUEST_TIMEOUT_S, then
    HTTP 408) plus three times what the fixture's start took on this machine under its present load.
    A fixed 60 s socket timeout failed this test once under the full suite's load on 2 cores (issue 35):
    the proxy's 408 itself came late there, so the client must wait for it longer than on a quiet machine."""
    return bs.REQUEST_TIMEOUT_S + 3 * max(_STARTUP_S + [20.0])


def _replica_pids(url: str, tries: int) -> set[int]:
    """The pids of the replicas that answer ``GET /info`` in ``tries`` requests (the router picks at random);
    a request the proxy has not answered in :func:`_patience_s` counts as no answer (the caller polls again)."""
    import json
    import urllib.error
    import urllib.request

    pids = set()
    for _ in range(tries):
        try:
            with urllib.request.urlopen(url + "info", timeout=_patience_s()) as reply:
                pids.add(json.loads(reply.read())["pid"])
        except (TimeoutError, urllib.error.URLError):
            continue
        if len(pids) == REPLICAS:
            break
    return pids


def _wait_for_replacement(url: str, killed: str, survivors: set[str]) -> None:
    """Wait, with bounds taken from Ray's own state, until REPLICAS replicas answer again, one of them new.

    1. The controller notices the death at its next health check (bs.HEALTH_CHECK_PERIOD_S) and creates a
       replacement actor: bounded by the period plus Ray's health-check timeout (30 s) and a margin.
    2. The replacement then starts like the fixture's replicas did: it gets three times what that start took
       on this machine under its present load (mostly Ray spawning a worker that imports tvm and torch, which
       slows with load: 4-13 s quiet, 25-120 s next to 2-4 CPU burners), and the wait stops at once if Ray
       gives up on the deployment (DEPLOY_FAILED). Done when Serve's status says every replica runs and
       ``GET /info`` is answered by REPLICAS distinct processes (the status alone can lag the new actor)."""
    from ray import serve

    def state():
        app = serve.status().applications["byoc_hetero"]
        return app.status, app.deployments["byoc_hetero"].status, dict(app.deployments["byoc_hetero"].replica_states)

    created_by = time.monotonic() + bs.HEALTH_CHECK_PERIOD_S + 30 + 30
    while not _replica_names() - survivors - {killed}:
        assert time.monotonic() < created_by, f"no replacement created for {killed}: {state()}"
        time.sleep(0.5)
    running_by = time.monotonic() + 3 * max(_STARTUP_S + [20.0])
    while True:
        app_status, status, replicas = state()
        assert status != "DEPLOY_FAILED", (app_status, status, replicas)
        if (app_status == "RUNNING" and replicas == {"RUNNING": REPLICAS} and killed not in _replica_names()
                and len(_replica_pids(url, 20)) == REPLICAS):
            return
        assert time.monotonic() < running_by, f"replacement not running in time: {(app_status, status, replicas)}"
        time.sleep(0.5)


def test_killed_replica_is_replaced_and_no_answer_is_wrong(library, served):
    import ray

    _, direct = library
    xs = [_inputs(1000 + i, 1 + i % 2) for i in range(40)]
    replicas = sorted(_replica_names())
    assert len(replicas) == REPLICAS

    def send(i):
        if i == 10:  # mid-load: kill one replica (Ray Serve must replace it)
            ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
        # the event waited for is the proxy's answer: within bs.REQUEST_TIMEOUT_S (408 past it) on a
        # quiet machine, later under load; the socket's bound is only a backstop scaled to that load
        return bs.post(served, xs[i], timeout=_patience_s())

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, range(len(xs))))
    ok = [(x, a) for x, a in zip(xs, answers) if a.status == 200]
    for x, answer in ok:
        np.testing.assert_allclose(answer.output, direct(x), rtol=1e-5, atol=1e-5)
    assert len(ok) >= len(xs) // 2, [a.status for a in answers]
    assert all(a.status in (200, 408, 500, 502, 503) for a in answers), [(a.status, a.error) for a in answers]

    _wait_for_replacement(served, replicas[0], set(replicas[1:]))
    for i in range(4):
        x = _inputs(5 + i, 3)
        answer = bs.post(served, x, timeout=_patience_s())
        assert answer.status == 200, answer
        np.testing.assert_allclose(answer.output, direct(x), rtol=1e-5, atol=1e-5)


def test_run_batch_groups_by_trailing_shape_and_splits_back():
    calls = []

    def run(inputs):
        calls.append(inputs[0].shape)
        return [inputs[0].sum(axis=tuple(range(1, inputs[0].ndim)))[:, None] * 2]

    items = [[np.ones((2, 3))], [np.ones((1, 4))], [np.full((3, 3), 2.0)], [np.ones((1, 4))]]
    answers = bs.run_batch(run, items)
    assert sorted(calls) == [(2, 4), (5, 3)]
    want = [np.full((2, 1), 6.0), np.full((1, 1), 8.0), np.full((3, 1), 12.0), np.full((1, 1), 8.0)]
    assert len(answers) == 4
    for (outputs, rows), w, r in zip(answers, want, (5, 2, 5, 2)):
        np.testing.assert_array_equal(outputs[0], w)
        assert rows == r
