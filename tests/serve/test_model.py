"""jetson-serve's model without Triton: the rows of a batch checked, grouped by (sampler, steps) and
sampled, each image the in-process Pipeline's for its seed; its options and start-up checks. None of
this needs PyTriton."""
from __future__ import annotations

import socket

import numpy as np
import pytest

from jetson_unet import serve
from jetson_unet.errors import ArenaError, UsageError


def request(seeds, steps, sampler):
    """A request as PyTriton hands it over: one row per image, BYTES as bytes objects."""
    n = len(seeds)
    samplers = sampler if isinstance(sampler, list) else [sampler] * n
    steps = steps if isinstance(steps, list) else [steps] * n
    return {"seed": np.array(seeds, np.int64).reshape(n, 1), "steps": np.array(steps, np.int32).reshape(n, 1),
            "sampler": np.array([s.encode() for s in samplers], np.object_).reshape(n, 1)}


BATCH = [request([5, 1], [3, 0], ["ddim", "dpmpp-2m"]), request([5], 3, "ddim"), request([2], 0, "ddpm"),
         request([7, 8, 9], 2, "dpmpp-2m")]


@pytest.fixture(scope="module")
def expected(pipe):
    """Each image of BATCH sampled alone, stacked per request."""
    def alone(seed, steps, sampler):
        return pipe.sample(seeds=[int(seed)], sampler=sampler.decode(), steps=int(steps) or None)
    return [np.concatenate([alone(*row) for row in zip(r["seed"][:, 0], r["steps"][:, 0], r["sampler"][:, 0])])
            for r in BATCH]


def test_each_image_is_the_pipelines_for_its_seed(pipe, expected, monkeypatch):
    calls = []
    real = pipe.sample
    monkeypatch.setattr(pipe, "sample", lambda **kw: calls.append(kw) or real(**kw))
    out = serve.Model(pipe)(BATCH)
    monkeypatch.undo()
    assert [o["image"].shape for o in out] == [(2, 16, 16, 3), (1, 16, 16, 3), (1, 16, 16, 3), (3, 16, 16, 3)]
    for i, (o, want) in enumerate(zip(out, expected)):
        np.testing.assert_array_equal(o["image"], want, err_msg=f"request {i}")
    # one call per (sampler, step count): ddim 3 (seeds 5, 5), dpmpp-2m 10 (1) and 2 (7, 8, 9), ddpm 10 (2)
    assert sorted((c["sampler"], c["steps"], len(c["seeds"])) for c in calls) == sorted(
        [("ddim", 3, 2), ("dpmpp-2m", 10, 1), ("dpmpp-2m", 2, 3), ("ddpm", 10, 1)])


@pytest.mark.parametrize("bad, message", [
    (request([1], 3, "euler"), "unknown sampler 'euler'"),
    (request([-1], 3, "ddim"), "seeds are integers 0 <= s < 2\\*\\*63, got -1"),
    (request([1], 11, "ddim"), "steps must be 0 .* to 10, got 11"),
    (request([1], -2, "ddim"), "got -2"),
    (request([1], 1, "dpmpp-2m"), "dpmpp-2m steps must be in 2..10"),
    (request([1], 4, "ddpm"), "DDPM runs all 10 steps"),
    ({**request([1, 2], 3, "ddim"), "steps": np.array([[3]], np.int32)}, "one value per image"),
])
def test_a_bad_request_fails_its_batch_before_any_sampling(pipe, bad, message, monkeypatch):
    monkeypatch.setattr(pipe, "sample", lambda **kw: pytest.fail("sampled before every request was checked"))
    with pytest.raises(UsageError, match=message):
        serve.Model(pipe)([bad])
    with pytest.raises(UsageError, match=f"{message}.*request 2 of 2 in this batch; none was run"):
        serve.Model(pipe)([request([3], 3, "ddim"), bad])


class _Full:
    """A pipeline whose memory refuses every batch (as Pipeline.sample raises ArenaError)."""

    def __init__(self, config):
        self.config = config

    def sample(self, **kw):
        raise ArenaError(f"batch {len(kw['seeds'])} needs about 9.0 GB: the largest batch that fits is 0")


def test_a_batch_that_does_not_fit_is_refused_with_its_reason(pipe, notes):
    with pytest.raises(ArenaError, match="largest batch that fits"):
        serve.Model(_Full(pipe.config))([request([1, 2], 3, "ddim")])
    assert any("failed 1 request(s): batch 2 needs" in n for n in notes), notes


def test_warm_refuses_a_max_batch_that_does_not_fit(pipe, monkeypatch):
    from jetson_unet.sampling import host
    monkeypatch.setattr(host, "available_bytes", lambda: 10 ** 9)
    with pytest.raises(ArenaError, match="largest batch that fits"):
        serve.warm(pipe, [1, 10 ** 6])
    assert serve.warm(pipe, [1, 4]) == {}   # numpy: no engines, batches run at their own size


def test_the_start_up_line_names_each_engine_and_its_time():
    assert serve.engines_text((1, 4), {1: (0.72e-3, 0.3e-3), 4: (1.9e-3, 0.4e-3)}) == \
        ", engines b1 0.72 ms/step, b4 1.90 ms/step"
    assert serve.engines_text((16,), {}) == ", engines b16" and serve.engines_text((), {}) == ""


NUMBERS = {"--max-batch-size": ["0", "x", "1.5"], "--queue-delay-us": ["-1", "x"],
           "--http-port": ["0", "65536", "x"], "--grpc-port": ["-1"], "--metrics-port": ["99999"], "--sms": ["0", "x"], "--batch-sizes": ["0", "x"]}


@pytest.mark.parametrize("flag, value", [(f, v) for f, vs in NUMBERS.items() for v in vs])
def test_every_numeric_option_is_refused_as_it_is_parsed(flag, value, capsys):
    assert serve.main([f"{flag}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jetson-serve: error: {flag}") and value in err and err.count("\n") == 1, err


def test_the_numeric_table_covers_every_typed_option():
    for a in serve.build_parser()._actions:
        assert a.type not in (int, float), a.option_strings
        if a.type is not None:
            assert any(f in NUMBERS for f in a.option_strings), f"{a.option_strings} has no case above"


def test_ports_in_use_or_repeated_are_refused():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        taken = s.getsockname()[1]
        args = serve.build_parser().parse_args(["--http-port", str(taken), "--grpc-port", "1", "--metrics-port", "2"])
        with pytest.raises(UsageError, match=f"--http-port {taken}: Address already in use"):
            serve.check_ports(args)
    args = serve.build_parser().parse_args(["--grpc-port", "8000"])
    with pytest.raises(UsageError, match="three different ports, got 8000, 8000, 8002"):
        serve.check_ports(args)


@pytest.mark.parametrize("libdir, shared, before, after", [
    ("/opt/py/lib", 1, None, "/opt/py/lib"),
    ("/opt/py/lib", 1, "/a:/b", "/opt/py/lib:/a:/b"),
    ("/opt/py/lib", 1, "/a:/opt/py/lib", "/a:/opt/py/lib"),   # there already
    ("/usr/lib", 1, "/a", "/a"),                             # the loader's own folder
    ("/opt/py/lib", 0, None, None),                          # a static libpython: nothing to load
])
def test_triton_loads_this_interpreters_libpython(monkeypatch, libdir, shared, before, after):
    import sysconfig
    values = {"LIBDIR": libdir, "Py_ENABLE_SHARED": shared, "MULTIARCH": "x86_64-linux-gnu"}
    monkeypatch.setattr(sysconfig, "get_config_var", values.get)
    env = serve.libpython_env({} if before is None else {"LD_LIBRARY_PATH": before})
    assert env.get("LD_LIBRARY_PATH") == after


def test_without_pytriton_one_line_names_the_extra(monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "pytriton", None)   # as where the serve extra is not installed
    assert serve.main(["--backend", "numpy"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("jetson-serve: error: PyTriton is not installed: pip install 'jetson-unet-runtime[serve]'")
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("found, message", [
    ("2.1.0", "PyTriton's Python stub needs NumPy < 2 in this interpreter's environment, found 2.1.0"),
    (None, "Triton's Python stub cannot import NumPy"),
])
def test_a_numpy_the_stub_cannot_use_is_named_before_anything_loads(monkeypatch, capsys, found, message):
    monkeypatch.setattr(serve, "stub_numpy", lambda environ: found)
    monkeypatch.setattr(serve, "_load_weights", lambda *a: pytest.fail("the weights loaded"))
    assert serve.main(["--backend", "numpy"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"jetson-serve: error: {message}") and err.count("\n") == 1, err


def test_the_stub_sees_this_environment_without_pythonpath(tmp_path):
    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '0.0.fake'\n")
    assert serve.stub_numpy({"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}) == np.__version__
