#!/usr/bin/env python3
"""Throughput of `jetson-serve`: a burst of concurrent batch-1 requests, with Triton's batching and
one image at a time. Needs the serve extra.

    python -m tools.serve_load --backend cupy --precision fp16                 # max batch 16 vs 1
    python -m tools.serve_load --url localhost:8001 --requests 256             # a server already running

Without --url, a server is started per --max-batch-size (on free ports), the burst is sent once
untimed and then timed, and the server is stopped with SIGTERM. Each request is one image (seed i,
the same sampler and steps for all), sent over gRPC from its own thread; the table gives requests/s
over the burst's wall time and the p50 / p99 latency of its requests.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

MODEL = "seed-unet"
# jetson-serve, as its entry point runs it (under `python -m jetson_unet.serve` its log would be __main__'s)
SERVE = [sys.executable, "-c", "import sys; from jetson_unet.serve import main; sys.exit(main())"]


def free_ports(n: int) -> List[int]:
    """n TCP ports that were free a moment ago (bound to port 0, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """`jetson-serve ARGS` on free ports: `http`, `grpc` (host:port) once ready()."""

    def __init__(self, args: Sequence[str], log: Optional[str] = None) -> None:
        self.ports = free_ports(3)
        http, grpc, metrics = self.ports
        self.http, self.grpc = f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"
        self.log_path = log
        self.log = open(log or os.devnull, "a")
        cmd = [*SERVE, *args, "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self, timeout: float) -> "Server":
        """Wait for /v2/health/ready (RuntimeError when the server exits or the time runs out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jetson-serve exited with {self.proc.returncode} before it was ready")
            if is_ready(self.http):
                return self
            time.sleep(0.1)
        raise RuntimeError(f"jetson-serve not ready after {timeout:g} s")

    def stop(self, timeout: float) -> int:
        """SIGTERM, then the exit status (killed, and RuntimeError, after `timeout` s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise RuntimeError(f"jetson-serve still running {timeout:g} s after SIGTERM") from None
        finally:
            self.log.close()


@contextlib.contextmanager
def running(args: Sequence[str], start_timeout: float = 600, stop_timeout: float = 60,
            log: Optional[str] = None) -> Iterator[Server]:
    server = Server(args, log)
    try:
        yield server.ready(start_timeout)
    finally:
        server.stop(stop_timeout)


def is_ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def inputs(client_module, seeds: Sequence[int], steps: int = 0, sampler: str = "dpmpp-2m",
           seed_dtype: type = np.int64) -> list:
    """The model's three inputs for images of `seeds` (one row each), for tritonclient.http or .grpc."""
    from tritonclient.utils import np_to_triton_dtype
    n = len(seeds)
    arrays = {"seed": np.array(seeds, seed_dtype).reshape(n, 1), "steps": np.full((n, 1), steps, np.int32),
              "sampler": np.full((n, 1), sampler.encode(), np.object_)}
    out = []
    for name, array in arrays.items():
        x = client_module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        x.set_data_from_numpy(array)
        out.append(x)
    return out


def burst(grpc: str, n: int, steps: int, sampler: str, timeout: float = 600) -> Tuple[float, List[float]]:
    """n one-image requests (seeds 0..n-1), each from its own thread and client, released together:
    (seconds from the first sent to the last answered, each request's latency)."""
    import tritonclient.grpc as client
    start = threading.Barrier(n)

    def one(seed: int) -> Tuple[float, float]:
        with client.InferenceServerClient(grpc) as c:
            x = inputs(client, [seed], steps, sampler)
            start.wait(timeout)
            t0 = time.perf_counter()
            c.infer(MODEL, x, client_timeout=timeout)
            return t0, time.perf_counter()

    with ThreadPoolExecutor(n) as pool:
        spans = list(pool.map(one, range(n)))
    return max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans), [t1 - t0 for t0, t1 in spans]


def measure(grpc: str, n: int, steps: int, sampler: str) -> dict:
    burst(grpc, n, steps, sampler)   # untimed: the server's first batches, the clients' first connections
    wall, lat = burst(grpc, n, steps, sampler)
    return {"requests_per_s": n / wall, "p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "p99_ms": 1e3 * float(np.percentile(lat, 99))}


def table(rows: List[Tuple[str, dict]]) -> str:
    lines = ["| server | requests/s | p50 ms | p99 ms |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {r['requests_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |" for name, r in rows]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.serve_load", description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="gRPC host:port of a running jetson-serve (else one is started)")
    p.add_argument("--requests", type=int, default=64, help="requests in the burst, all sent at once")
    p.add_argument("--sampler", default="dpmpp-2m")
    p.add_argument("--steps", type=int, default=0, help="0: the sampler's default")
    p.add_argument("--max-batch-size", type=int, nargs="+", default=[16, 1], help="one server each")
    p.add_argument("--queue-delay-us", type=int, default=1000)
    p.add_argument("--weights", default=None)
    p.add_argument("--backend", default="auto")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--log", default=None, help="append the servers' output to this file")
    args = p.parse_args(argv)
    if args.url:
        rows = [(args.url, measure(args.url, args.requests, args.steps, args.sampler))]
    else:
        rows = []
        weights = ["--weights", args.weights] if args.weights else []
        for mb in args.max_batch_size:
            serve = ["--backend", args.backend, "--precision", args.precision, "--max-batch-size", str(mb),
                     "--queue-delay-us", str(args.queue_delay_us), *weights]
            with running(serve, log=args.log) as server:
                rows.append((f"max batch {mb}", measure(server.grpc, args.requests, args.steps, args.sampler)))
    print(f"{args.requests} concurrent one-image requests, {args.sampler}, steps {args.steps or 'default'}, "
          f"{args.backend} {args.precision}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
