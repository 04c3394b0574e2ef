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
from conftest import HANG_GUARD_S, docs_blocks, start_serving, until  # noqa: E402
from byoc_hetero import serve as bs  # noqa: E402
from byoc_hetero.inputs import TensorSpec  # noqa: E402

REPLICAS = 2
_STARTUP_S: list[float] = []  # how long the fixture's start took on this machine, under its present load



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cnn(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 8 * 8, 10)).eval()


def _export(net, path):
    n = torch.export.Dim("N", min=1, max=64)
    mod, params = bh.from_torch(net, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: n},))
    path = bs.export(bh.partition(mod, params), path)
    direct = bh.vm(tvm.runtime.load_module(str(path)))
    return path, lambda x: direct["main"](x).numpy()


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """A small CNN with a symbolic batch (declared 1..64), partitioned and exported for serving."""
    return _export(_cnn(0), tmp_path_factory.mktemp("serve") / "cnn.so")


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """The deployment's other models: version 2 of "cnn" (other weights), and "cnn_ort", the first CNN as
    ONNX on ONNX Runtime; each with its direct run."""
    import onnxruntime as ort

    tmp = tmp_path_factory.mktemp("serve_more")
    v2 = _export(_cnn(1), tmp / "cnn2.so")
    onnx_path = tmp / "cnn_ort.onnx"
    torch.onnx.export(_cnn(0), (torch.randn(2, 3, 8, 8),), str(onnx_path), input_names=["input"],
                      output_names=["output0"], dynamic_axes={"input": {0: "N"}, "output0": {0: "N"}},
                      dynamo=False, opset_version=17)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return {"v2": v2, "ort": (onnx_path, lambda x: sess.run(None, {"input": x})[0])}


MAX_REQUEST_BYTES = 1 << 20


@pytest.fixture(scope="module")
def served(library, others):
    path, _ = library
    port = _free_port()
    began = time.monotonic()
    models = [str(path), f"cnn:2={others['v2'][0]}", str(others["ort"][0])]  # names: cnn (stem), cnn, cnn_ort
    start_serving(bs.app(models, replicas=REPLICAS, cpus=1, batch=True, max_batch_rows=16, batch_wait_s=0.05,
                         max_request_bytes=MAX_REQUEST_BYTES), port, num_cpus=REPLICAS + 1)
    _STARTUP_S.append(time.monotonic() - began)
    yield f"http://127.0.0.1:{port}/"
    bs.shutdown()
    import ray

    assert not ray.is_initialized()


def _post(url: str, x: np.ndarray):
    """``bs.post`` bounded only against a hang (:data:`HANG_GUARD_S`): the proxy answers within
    bs.REQUEST_TIMEOUT_S (HTTP 408 past it), later on a loaded machine."""
    return bs.post(url, x, timeout=HANG_GUARD_S)


def _inputs(seed: int, rows: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 3, 8, 8)).astype("float32")


def test_answers_match_a_direct_run(library, served):
    _, direct = library
    xs = [_inputs(i, 1 + i % 3) for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda x: _post(served, x), xs))
    for x, answer in zip(xs, answers):
        assert answer.status == 200, answer.error
        np.testing.assert_allclose(answer.output, direct(x), rtol=1e-5, atol=1e-5)


def test_concurrent_requests_are_batched(library, served):
    _, direct = library
    for volley in range(3):  # batching depends on arrival times: a few volleys, bounded
        xs = [_inputs(100 + i, 1) for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda x: _post(served, x), xs))
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
    answer = _post(served, body)
    assert answer.status == 400 and needle in answer.error, answer
    x = _inputs(7, 2)  # the replica is alive and answers right
    good = _post(served, x)
    assert good.status == 200
    np.testing.assert_allclose(good.output, library[1](x), rtol=1e-5, atol=1e-5)


def test_unreadable_bodies_are_400(served):
    import urllib.error
    import urllib.request

    for data, ctype in ((b"hello", "text/plain"), (b"{\"x\": 1}", "application/json")):
        req = urllib.request.Request(served, data=data, headers={"content-type": ctype})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=HANG_GUARD_S)
        assert err.value.code == 400 and b"request:" in err.value.read()


def test_json_requests(library, served):
    import json
    import urllib.request

    x = _inputs(3, 2)
    req = urllib.request.Request(served, data=json.dumps({"inputs": [x.tolist()]}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_GUARD_S) as reply:
        doc = json.loads(reply.read())
    assert doc["shape"] == [2, 10] and doc["dtype"] == "float32"
    np.testing.assert_allclose(np.asarray(doc["outputs"][0], "float32"), library[1](x), rtol=1e-5, atol=1e-5)


def test_replica_threads_come_from_its_cpu_budget(served):
    import json
    import urllib.request

    with urllib.request.urlopen(served + "info", timeout=HANG_GUARD_S) as reply:
        info = json.loads(reply.read())
    assert info["cpus"] == 1 and info["runtime_threads"] == 1
    assert info["env"] == {k: "1" for k in bs.THREAD_ENV}


def test_requests_are_bounded_and_dead_replicas_noticed_fast(served):
    """The proxy bounds every request (a 408 instead of a request held until the client gives up) and the
    controller health-checks replicas every bs.HEALTH_CHECK_PERIOD_S (it replaces a dead one only then)."""
    import ray

    controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    details = ray.get(controller.get_serve_instance_details.remote(), timeout=HANG_GUARD_S)
    assert details["http_options"]["request_timeout_s"] == bs.REQUEST_TIMEOUT_S
    deployment = details["applications"]["byoc_hetero"]["deployments"]["byoc_hetero"]
    assert deployment["deployment_config"]["health_check_period_s"] == bs.HEALTH_CHECK_PERIOD_S


# -- the Open Inference Protocol (KServe v2), driven by tritonclient unchanged --------------------------

def _client(url: str):
    httpclient = pytest.importorskip("tritonclient.http")
    return httpclient, httpclient.InferenceServerClient(url.split("//")[1].rstrip("/"), network_timeout=HANG_GUARD_S)


def _infer_input(httpclient, x, datatype="FP32", binary=True, name="input"):
    inp = httpclient.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary)
    return inp


def test_v2_health_metadata_and_versions(served):
    _, client = _client(served)
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert client.is_model_ready("cnn") and client.is_model_ready("cnn", "2") and client.is_model_ready("cnn_ort")
    meta = client.get_model_metadata("cnn")
    assert meta["versions"] == ["1", "2"] and meta["platform"] == "byoc_hetero"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 8, 8]}]
    assert meta["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [-1, 10]}]
    ort_meta = client.get_model_metadata("cnn_ort", "1")
    assert ort_meta["platform"] == "onnxruntime_onnx" and ort_meta["inputs"][0]["shape"] == [-1, 3, 8, 8]


def test_v2_infer_binary_and_json_tensors_per_model_and_version(library, others, served):
    httpclient, client = _client(served)
    x = _inputs(11, 3)
    binary = client.infer("cnn", [_infer_input(httpclient, x)], model_version="1")  # binary both ways (default)
    assert binary.get_response()["model_version"] == "1"
    np.testing.assert_array_equal(binary.as_numpy("output0"), library[1](x))
    as_json = client.infer("cnn", [_infer_input(httpclient, x, binary=False)],  # no version: the highest
                           outputs=[httpclient.InferRequestedOutput("output0", binary_data=False)])
    assert as_json.get_response()["model_version"] == "2" and "data" in as_json.get_response()["outputs"][0]
    np.testing.assert_array_equal(as_json.as_numpy("output0"), others["v2"][1](x))
    assert not np.allclose(others["v2"][1](x), library[1](x))  # version 2 is another model
    gzipped = client.infer("cnn", [_infer_input(httpclient, x)], "1", request_compression_algorithm="gzip")
    np.testing.assert_array_equal(gzipped.as_numpy("output0"), library[1](x))
    on_ort = client.infer("cnn_ort", [_infer_input(httpclient, x)]).as_numpy("output0")
    np.testing.assert_allclose(on_ort, others["ort"][1](x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(on_ort, library[1](x), rtol=1e-4, atol=1e-4)


def test_v2_concurrent_requests_are_batched_and_answered_as_unbatched(library, served):
    """Each answer is bit for bit the direct, unbatched run of its own request."""
    httpclient, _ = _client(served)

    def one(x):
        _, client = _client(served)  # a client per thread (tritonclient's http client is not thread-safe)
        result = client.infer("cnn", [_infer_input(httpclient, x)], model_version="1")
        return result.as_numpy("output0"), result.get_response()["parameters"]["batch_rows"]

    for volley in range(3):  # batching depends on arrival times: a few volleys, bounded
        xs = [_inputs(200 + 16 * volley + i, 1 + i % 2) for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, xs))
        for x, (y, _) in zip(xs, answers):
            np.testing.assert_array_equal(y, library[1](x))
        if max(rows for _, rows in answers) > 2:
            return
    pytest.fail("48 concurrent v2 requests never shared a call")


def _status(call) -> tuple[int, str]:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as err:
        call()
    return int(err.value.status()), err.value.message()


def test_v2_bad_requests_never_reach_a_model(library, served):
    import urllib.error
    import urllib.request

    httpclient, client = _client(served)
    x = _inputs(5, 2)
    assert _status(lambda: client.infer("nope", [_infer_input(httpclient, x)]))[0] == 404
    assert _status(lambda: client.infer("cnn", [_infer_input(httpclient, x)], model_version="3"))[0] == 404
    assert _status(lambda: client.get_model_metadata("nope"))[0] == 404
    for bad, needle in ((_infer_input(httpclient, x.astype("float64"), "FP64"), "expected dtype float32, got float64"),
                        (_infer_input(httpclient, x[:, :, :7].copy()), "expected shape [s"),
                        (_infer_input(httpclient, x, name="image"), "takes inputs ['input'], got ['image']"),
                        (_infer_input(httpclient, np.zeros((17, 3, 8, 8), "float32")), "more than max_batch_rows=16")):
        status, message = _status(lambda: client.infer("cnn", [bad]))
        assert status == 400 and needle in message, (status, message)
    url = served + "v2/models/cnn/infer"
    for body, headers, code in ((b"{not json", {}, 400),
                                (b'{"inputs": []}xx', {"Inference-Header-Content-Length": "14"}, 400),
                                (b"{}" + b" " * MAX_REQUEST_BYTES, {}, 413)):
        req = urllib.request.Request(url, data=body, headers={"content-type": "application/json", **headers})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=HANG_GUARD_S)
        assert err.value.code == code, err.value.read()
    good = client.infer("cnn", [_infer_input(httpclient, x)], "1")  # the replicas are alive and answer right
    np.testing.assert_array_equal(good.as_numpy("output0"), library[1](x))


def test_the_docs_client_calls_run(library, served):
    import json
    import subprocess

    pytest.importorskip("tritonclient.http")
    py, sh = docs_blocks("serving.md", "Clients")
    host = served.split("//")[1].rstrip("/")
    namespace: dict = {}
    exec(compile(py.replace("127.0.0.1:8000", host), "serving_md_client.py", "exec"), namespace)  # noqa: S102
    np.testing.assert_array_equal(namespace["y"], library[1](namespace["x"]))
    lines = subprocess.run(["bash", "-c", sh.replace("127.0.0.1:8000", host)], capture_output=True, text=True,
                           timeout=HANG_GUARD_S, check=True).stdout.splitlines()
    assert lines[0] == "200", lines
    answer = json.loads(lines[1])
    y = np.asarray(answer["outputs"][0]["data"], "float32").reshape(answer["outputs"][0]["shape"])
    np.testing.assert_array_equal(y, library[1](np.full((1, 3, 8, 8), 0.5, "float32")))


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "metrics", timeout=HANG_GUARD_S) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(samples, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def test_metrics_count_requests_failures_latency_and_batches(served):
    """After the v2 tests above: requests and failures by model and code, queue and compute histograms,
    batch rows, all labelled by replica (records arrive within bs metrics' flush period)."""
    from byoc_hetero.serve import metrics

    samples: dict = {}

    def recorded() -> bool:  # the event waited for: the records of the tests above reached the exporter
        samples.clear()
        samples.update(_scrape(served))
        return (_total(samples, "byoc_hetero_requests_total", model="cnn", version="1", protocol="v2",
                       code="200") >= 21  # what the tests above answered at least
                and _total(samples, "byoc_hetero_request_failures_total", code="404") >= 3
                and _total(samples, "byoc_hetero_request_failures_total", model="cnn", code="413") >= 1)

    until(recorded, "the metrics of the requests above", metrics.FLUSH_PERIOD_S,
          lambda: {k: v for k, v in samples.items() if k[0].endswith("_total")})
    assert _total(samples, "byoc_hetero_request_failures_total", model="cnn", version="2", code="400") >= 6
    assert _total(samples, "byoc_hetero_requests_total", model="cnn_ort", code="200") >= 1
    calls = _total(samples, "byoc_hetero_batch_rows_count", model="cnn")
    rows = _total(samples, "byoc_hetero_batch_rows_sum", model="cnn")
    assert 0 < calls < rows  # some calls ran several rows
    assert _total(samples, "byoc_hetero_compute_seconds_count", model="cnn") == calls
    assert _total(samples, "byoc_hetero_queue_seconds_count", model="cnn") >= calls
    assert _total(samples, "byoc_hetero_request_seconds_count", protocol="v2") >= 21
    replicas = {dict(ls)["replica"] for (n, ls) in samples if n == "byoc_hetero_requests_total"}
    assert 1 <= len(replicas) <= REPLICAS
    for name in metrics.METRICS:  # every documented metric is exported
        assert any(n.startswith(name) for n, _ in samples), name


def _replica_names() -> set[str]:
    import ray

    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)  # not the metrics deployment's
            if a["name"].startswith("SERVE_REPLICA::byoc_hetero#byoc_hetero#")}


def _patience_s() -> float:
    """How long a ``GET /info`` poll waits for the proxy's answer before it counts as no answer (the caller
    polls again): the proxy's own bound (bs.REQUEST_TIMEOUT_S, then HTTP 408) plus three times what the
    fixture's start took on this machine under its present load."""
    return bs.REQUEST_TIMEOUT_S + 3 * max(_STARTUP_S + [20.0])


def _deployment_state() -> tuple[str, str, dict]:
    """(the app's status, the deployment's status, its replica states) from Serve's status."""
    from ray import serve

    app = serve.status().applications["byoc_hetero"]
    return app.status, app.deployments["byoc_hetero"].status, dict(app.deployments["byoc_hetero"].replica_states)


def _until(event, what: str, poll_s: float = 0.5) -> None:
    """Poll ``event()`` until it is true; fail at once when the deployment failed, or past HANG_GUARD_S."""

    def deployed():
        state = _deployment_state()
        assert state[1] != "DEPLOY_FAILED", (what, state)
        return state

    until(event, what, poll_s, deployed)


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
    """Wait until REPLICAS replicas answer again, one of them new: the controller notices the death at its next
    health check (bs.HEALTH_CHECK_PERIOD_S) and creates a replacement actor, which then starts like the
    fixture's replicas did (mostly Ray spawning a worker that imports tvm and torch: 4-13 s quiet, 25-120 s next
    to 2-4 CPU burners, longer under the full suite). Done when Serve's status says every replica runs and
    ``GET /info`` is answered by REPLICAS distinct processes (the status alone can lag the new actor); fails at
    once if Ray gives up on the deployment (DEPLOY_FAILED), otherwise only past :data:`HANG_GUARD_S`."""
    _until(lambda: bool(_replica_names() - survivors - {killed}), f"a replacement actor for {killed}")

    def running() -> bool:
        app_status, _, replicas = _deployment_state()
        return (app_status == "RUNNING" and replicas == {"RUNNING": REPLICAS} and killed not in _replica_names()
                and len(_replica_pids(url, 20)) == REPLICAS)

    _until(running, "the replacement running and answering")


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
        # quiet machine, later under load; the socket's bound is only a guard against a hang
        return _post(served, xs[i])

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(send, i) for i in range(len(xs))]
        _until(lambda: all(f.done() for f in futures), "the answers of the requests sent while a replica died")
        answers = [f.result() for f in futures]
    ok = [(x, a) for x, a in zip(xs, answers) if a.status == 200]
    for x, answer in ok:
        np.testing.assert_allclose(answer.output, direct(x), rtol=1e-5, atol=1e-5)
    assert len(ok) >= len(xs) // 2, [a.status for a in answers]
    assert all(a.status in (200, 408, 500, 502, 503) for a in answers), [(a.status, a.error) for a in answers]

    _wait_for_replacement(served, replicas[0], set(replicas[1:]))
    for i in range(4):
        x = _inputs(5 + i, 3)
        answer = _post(served, x)
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


class _FakeEngine:
    entry, ranges = "main", {}
    specs = [TensorSpec("a", "float32", ("n", 2)), TensorSpec("b", "int64", ("n",))]
    outputs = [TensorSpec("output0", "float32", ("n", 2))]


def _fake_model():
    from byoc_hetero.serve.core import Model, ModelSpec

    return Model(ModelSpec("m", "1", "m.so", "byoc"), _FakeEngine())


def test_v2_binary_and_json_tensors_parse_in_the_models_order():
    import json

    from byoc_hetero.serve import kserve

    a, b = np.arange(6, dtype="float32").reshape(3, 2), np.array([1, -2, 3], "int64")
    head = json.dumps({"id": "7", "inputs": [
        {"name": "b", "datatype": "INT64", "shape": [3], "data": b.tolist()},
        {"name": "a", "datatype": "FP32", "shape": [3, 2], "parameters": {"binary_data_size": a.nbytes}}],
        "outputs": [{"name": "output0", "parameters": {"binary_data": True}}]}).encode()
    doc, inputs = kserve.parse_infer(head + a.tobytes(), str(len(head)), _fake_model())
    np.testing.assert_array_equal(inputs[0], a)
    np.testing.assert_array_equal(inputs[1], b)
    assert inputs[1].dtype == np.int64
    body, headers = kserve.format_infer(doc, _fake_model(), [a * 2], batch_rows=3)
    n = int(headers[kserve.HEADER_LENGTH])
    answer = json.loads(body[:n])
    assert answer["id"] == "7" and answer["parameters"] == {"batch_rows": 3}
    assert answer["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [3, 2],
                                  "parameters": {"binary_data_size": 24}}]
    np.testing.assert_array_equal(np.frombuffer(body[n:], "float32").reshape(3, 2), a * 2)


@pytest.mark.parametrize("inputs, header, needle", [
    ([{"name": "a", "datatype": "BYTES", "shape": [1], "data": ["x"]}], None, "datatype 'BYTES' is not supported"),
    ([{"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}], None, "3 values for shape [2, 2]"),
    ([{"name": "a", "datatype": "FP32", "shape": [1, -2], "data": []}], None, "shape must be a list of sizes"),
    ([{"name": "a", "datatype": "FP32", "shape": [1], "data": ["x"]}], None, "data is not FP32"),
    ([{"name": "a", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}], "0",
     "8 binary bytes announced, 0 left"),
    ([{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}], None, "takes inputs ['a', 'b'], got ['a']"),
])
def test_v2_requests_that_do_not_parse_are_400s(inputs, header, needle):
    import json

    from byoc_hetero.serve import RequestError, kserve

    body = json.dumps({"inputs": inputs}).encode()
    with pytest.raises(RequestError) as err:
        kserve.parse_infer(body, None if header is None else str(len(body)), _fake_model())
    assert err.value.status == 400 and needle in str(err.value), str(err.value)


def test_model_specs_name_version_and_engine(tmp_path):
    lib, onnx_file = tmp_path / "cnn.so", tmp_path / "ref.onnx"
    lib.write_bytes(b"x")
    onnx_file.write_bytes(b"x")
    specs = bs.model_specs([str(lib), f"cnn:2={lib}", str(onnx_file)])
    assert [(s.name, s.version, s.engine) for s in specs] == [("cnn", "1", "byoc"), ("cnn", "2", "byoc"),
                                                              ("ref", "1", "onnxruntime")]
    with pytest.raises(bh.ByocError, match="cnn version 1 given twice"):
        bs.model_specs({"cnn": lib, "cnn:1": lib})
    with pytest.raises(bh.ByocError, match="no such file"):
        bs.model_spec("x=missing.so")
    with pytest.raises(bh.ByocError, match="model name 'a/b'"):
        bs.model_spec(f"a/b={lib}")


def test_a_failing_model_call_fails_its_own_requests_only():
    from byoc_hetero.serve.core import Model, ModelSpec, _Item, _run_items

    class Broken(_FakeEngine):
        def run(self, inputs):
            raise RuntimeError("kernel failed")

    class Doubling(_FakeEngine):
        def run(self, inputs):
            return [inputs[0] * 2]

    good, bad = (Model(ModelSpec(n, "1", f"{n}.so", "byoc"), e()) for n, e in (("good", Doubling), ("bad", Broken)))
    x = np.ones((2, 2), "float32")
    answers, calls = _run_items([_Item(good, [x]), _Item(bad, [x]), _Item(good, [x + 1])])
    np.testing.assert_array_equal(answers[0][0][0], x * 2)
    np.testing.assert_array_equal(answers[2][0][0], (x + 1) * 2)
    assert answers[0][1] == answers[2][1] == 4  # one call of both requests' rows
    assert isinstance(answers[1], RuntimeError) and len(calls) == 1


def test_gzip_and_deflate_bodies_are_inflated_within_the_limit():
    import zlib

    from byoc_hetero.serve import RequestError
    from byoc_hetero.serve.core import _decompress

    body = b'{"inputs": []}' * 10
    assert _decompress(zlib.compress(body), "deflate", 1000) == body
    gz = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    assert _decompress(gz.compress(body) + gz.flush(), "gzip", 1000) == body
    for data, encoding, limit, code in ((zlib.compress(b"0" * 5000), "deflate", 1000, 413), (body, "gzip", 1000, 400),
                                        (body, "br", 1000, 400)):
        with pytest.raises(RequestError) as err:
            _decompress(data, encoding, limit)
        assert err.value.status == code, err.value
