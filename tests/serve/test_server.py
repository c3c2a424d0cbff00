"""jetson-serve end to end on localhost: the tiny model on the NumPy backend behind Triton, asked over
HTTP, gRPC and plain KServe v2 JSON. Every image is the in-process Pipeline's for its seed, concurrent
requests are batched, bad requests are answered with errors while the server carries on, and SIGTERM
finishes the request in flight, exits 0 and frees the ports. Skipped without the serve extra."""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("pytriton.triton", reason="needs the serve extra (PyTriton)")
http = pytest.importorskip("tritonclient.http")
grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from tools import serve_load  # noqa: E402
from tools.serve_load import MODEL, Server, inputs, port_in_use  # noqa: E402

pytestmark = pytest.mark.slow   # a Triton server starts and stops: about 15 s of the module's time
TIMEOUT = 30   # seconds, for any one request


@pytest.fixture(scope="module")
def server(serve_weights, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    s = Server(["--weights", serve_weights, "--backend", "numpy", "--max-batch-size", "8",
                "--queue-delay-us", "100000", "-v"], log=str(log))
    try:
        yield s.ready(60)
    finally:
        if s.proc.poll() is None:
            s.stop(60)


def batches(server) -> list:
    """The (requests, images) of each batch the server ran so far (its -v log)."""
    with open(server.log_path, errors="replace") as f:
        text = f.read()
    return [tuple(map(int, m)) for m in re.findall(r"batch of (\d+) request\(s\), (\d+) image", text)]


def infer(module, address, seeds, steps, sampler, seed_dtype=np.int64, start=None):
    """The images of one request; `start`: a barrier passed just before the request is sent."""
    with module.InferenceServerClient(address) as c:
        kw = {"client_timeout": TIMEOUT} if module is grpc else {}
        x = inputs(module, seeds, steps, sampler, seed_dtype)
        if start is not None:
            start.wait(TIMEOUT)
        return c.infer(MODEL, x, **kw).as_numpy("image")


def test_one_request_over_http_grpc_and_kserve_json(server, pipe):
    want = pipe.sample(seeds=[7], sampler="ddim", steps=4)
    np.testing.assert_array_equal(infer(http, server.http, [7], 4, "ddim"), want)
    np.testing.assert_array_equal(infer(grpc, server.grpc, [7], 4, "ddim"), want)
    body = {"inputs": [{"name": "seed", "datatype": "INT64", "shape": [1, 1], "data": [7]},
                       {"name": "steps", "datatype": "INT32", "shape": [1, 1], "data": [4]},
                       {"name": "sampler", "datatype": "BYTES", "shape": [1, 1], "data": ["ddim"]}]}
    req = urllib.request.Request(f"http://{server.http}/v2/models/{MODEL}/infer", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        out = json.load(r)["outputs"][0]
    assert out["name"] == "image" and out["datatype"] == "UINT8" and out["shape"] == [1, 16, 16, 3]
    np.testing.assert_array_equal(np.array(out["data"], np.uint8).reshape(out["shape"]), want)


def test_a_burst_of_concurrent_requests_is_batched_and_each_image_is_its_seeds(server, pipe):
    jobs = [(seed, 4, "ddim") if seed % 2 else (seed, 3, "dpmpp-2m") for seed in range(6)]
    before, start = len(batches(server)), threading.Barrier(len(jobs))
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: infer(grpc, server.grpc, [job[0]], job[1], job[2], start=start), jobs))
    for (seed, steps, sampler), image in zip(jobs, got):
        np.testing.assert_array_equal(image, pipe.sample(seeds=[seed], sampler=sampler, steps=steps),
                                      err_msg=f"seed {seed}")
    ran = batches(server)[before:]
    assert sum(n for n, _ in ran) == 6 and max(n for n, _ in ran) > 1, ran


@pytest.mark.parametrize("seeds, steps, sampler, seed_dtype, message", [
    ([1], 4, "euler", np.int64, "unknown sampler 'euler'"),
    ([1], 11, "ddim", np.int64, "steps must be 0"),
    ([-1], 4, "ddim", np.int64, "seeds are integers 0 <= s < 2"),
    ([1], 4, "ddim", np.int32, "data-type is 'INT32', but model 'seed-unet' expects 'INT64'"),
    ([1] * 9, 4, "ddim", np.int64, "batch-size must be <= 8"),
])
def test_a_bad_request_gets_an_error_and_the_server_carries_on(server, pipe, seeds, steps, sampler, seed_dtype,
                                                               message):
    for module, address in ((http, server.http), (grpc, server.grpc)):
        with pytest.raises(InferenceServerException, match=re.escape(message)):
            infer(module, address, seeds, steps, sampler, seed_dtype)
    still = infer(http, server.http, [3], 2, "ddim")
    np.testing.assert_array_equal(still, pipe.sample(seeds=[3], sampler="ddim", steps=2))


def test_a_wrong_shape_gets_an_error(server):
    with http.InferenceServerClient(server.http) as c:
        x = [http.InferInput("seed", [1, 2], "INT64")] + inputs(http, [1], 4, "ddim")[1:]
        x[0].set_data_from_numpy(np.array([[1, 2]], np.int64))
        with pytest.raises(InferenceServerException, match="unexpected shape"):
            c.infer(MODEL, x)


def test_the_load_tool_reports_a_table(server, capsys):
    assert serve_load.main(["--url", server.grpc, "--requests", "3", "--sampler", "ddim", "--steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "| server | requests/s | p50 ms | p99 ms |" and lines[3].startswith(f"| {server.grpc} | "), lines


def test_sigterm_finishes_the_request_in_flight_exits_0_and_frees_the_ports(server, pipe):
    """Last in this module: it stops the server."""
    before, result = len(batches(server)), {}
    # 3 images of 5 steps: in flight for seconds (the stop waits for it), short enough on a loaded 2-core machine
    slow = threading.Thread(target=lambda: result.update(image=infer(grpc, server.grpc, [4, 5, 6], 5, "ddim")))
    slow.start()
    deadline = time.monotonic() + TIMEOUT
    while len(batches(server)) == before and time.monotonic() < deadline:   # the batch is running
        time.sleep(0.05)
    t0 = time.monotonic()
    assert server.stop(60) == 0
    slow.join(TIMEOUT)
    stopped_s = time.monotonic() - t0   # the in-flight batch finished and the server gone, not our check below
    np.testing.assert_array_equal(result["image"], pipe.sample(seeds=[4, 5, 6], sampler="ddim", steps=5))
    assert not any(port_in_use(p) for p in server.ports), server.ports
    # at most Triton's exit timeout (30 s) for a connection it still counts as live (docs/serving.md),
    # plus the exit: in full local runs 1 in ~4 took 31.2 s, the others ~2 s; a hang goes past it
    assert stopped_s < 30 + 15
