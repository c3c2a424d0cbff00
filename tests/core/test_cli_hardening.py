"""The CLIs refuse before the work starts, in one line and never with a traceback, and leave nothing
half-written. Each case of the issue has a test, and so has the class it stands for: every output
location of every CLI, every numeric option of every parser, a full disk at any file of a set."""
from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jetson_unet import cli, files, tune
from jetson_unet.bench import report, runner
from jetson_unet.errors import RuntimeErrorBase, UsageError
from jetson_unet.files import OutputError
from jetson_unet.model.config import Schedule, UNetConfig
from jetson_unet.model.weights import random_params, save_weights

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32, schedule=Schedule(timesteps=10, beta_end=0.005))
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("w") / "tiny.npz"
    save_weights(path, TINY, random_params(TINY, seed=3))
    return str(path)


def work_started(*a, **kw):
    raise AssertionError("the work started before the usage error")


@pytest.fixture
def no_work(monkeypatch):
    """Every CLI's first long step fails the test: a usage error must come before it."""
    from jetson_unet.build import aot
    from jetson_unet.model import weights as weights_mod
    for owner, name in ((cli, "_load_weights"), (weights_mod, "load_weights"), (weights_mod, "save_weights"),
                        (tune, "get_backend"), (aot, "pick_compiler"), (aot, "prepare")):
        monkeypatch.setattr(owner, name, work_started)


def one_error_line(capsys, prog: str, after_notes: bool = False) -> str:
    """The one error line on stderr (with after_notes: the last line, after progress lines and notices)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and [ln for ln in lines if "error" in ln] == lines[-1:], err
    assert (after_notes or len(lines) == 1) and lines[-1].startswith(f"{prog}: error: "), err
    return lines[-1]


def files_under(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ---- every output location of every CLI, before any work ---------------------------------------------

def _sample(flag, extra=()):
    def argv(w, target):
        return ["--weights", w, *extra, flag, target]
    return cli.main, "jetson-sample", argv


OUTPUTS = {   # name: (main, prog, argv(weights, target), flag, the target is a folder)
    "sample --out": (*_sample("--out"), "--out", False),
    "sample --save-each": (*_sample("--save-each"), "--save-each", True),
    "sample --trace": (*_sample("--trace"), "--trace", False),
    "sample --cache": (*_sample("--cache"), "--cache", True),
    "sample --prepare --cache": (*_sample("--cache", ["--prepare", "--arch", "87"]), "--cache", True),
    "bench --out": (runner.main, "jetson-bench", lambda w, t: ["--weights", w, "--out", t], "--out", True),
    "tune --json": (tune.main, "jetson-tune", lambda w, t: ["--json", t, "--out-dir", str(Path(w).parent)],
                    "--json", False),
    "tune --out-dir": (tune.main, "jetson-tune", lambda w, t: ["--out-dir", t], "--out-dir", True),
    "weights random OUT": (cli.weights_cli, "jetson-weights", lambda w, t: ["random", t], "OUT", False),
    "weights convert DST": (cli.weights_cli, "jetson-weights", lambda w, t: ["convert", w, t], "DST", False),
}
SUFFIX = {"sample --out": ".png", "sample --trace": ".json", "tune --json": ".json", "weights random OUT": ".npz",
          "weights convert DST": ".safetensors"}


@pytest.mark.parametrize("kind", ["not-a-folder", "proc", "sys", "read-only", "permission"])
@pytest.mark.parametrize("name", list(OUTPUTS))
def test_every_output_location_is_proven_before_any_work(weights, tmp_path, capsys, monkeypatch, no_work,
                                                          name, kind):
    main, prog, argv, flag, folder = OUTPUTS[name]
    ok = tmp_path / "ok"
    where = {"not-a-folder": tmp_path / "file", "proc": Path("/proc"), "sys": Path("/sys")}.get(kind, ok)
    (tmp_path / "file").write_text("x")
    ok.mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")   # where jetson-sample's default --out goes (proven, never written)
    target = where if folder else where / f"out{SUFFIX.get(name, '')}"
    why = {"not-a-folder": "not a folder", "proc": "/proc is a kernel file system", "sys": "/sys is a kernel file system",
           "read-only": "read-only file system", "permission": "permission denied"}[kind]
    code = errno.EROFS if kind == "read-only" else errno.EACCES
    real = files.tempfile.mkstemp

    def mkstemp(*a, dir=None, **kw):   # the "ok" folder as if read-only or not ours
        if dir == str(ok) and kind in ("read-only", "permission"):
            raise OSError(code, os.strerror(code))
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp)
    before = files_under(tmp_path)
    assert main(argv(weights, str(target))) == 2
    line = one_error_line(capsys, prog)
    assert f"error: {flag} {target}" in line and why in line, line
    assert files_under(tmp_path) == before


def test_prepare_into_a_file_fails_before_compiling(weights, tmp_path, capsys, no_work):
    """The issue's case: `--prepare --cache <a file>` compiled for 38 s before it said so."""
    (tmp_path / "f").write_text("x")
    t0 = time.perf_counter()
    assert cli.main(["--prepare", "--weights", weights, "--arch", "87", "--cache", str(tmp_path / "f")]) == 2
    assert "--cache" in one_error_line(capsys, "jetson-sample") and time.perf_counter() - t0 < 5


def test_the_default_kernel_cache_is_proven_for_prepare(weights, tmp_path, capsys, monkeypatch, no_work):
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("JETSON_UNET_CACHE", str(tmp_path / "f"))
    assert cli.main(["--prepare", "--weights", weights, "--arch", "87"]) == 2
    assert "kernel cache" in one_error_line(capsys, "jetson-sample")


# ---- every numeric option of every parser, at parse time -----------------------------------------------

NUMBERS = {   # (main, prog, base argv): {flag: bad values}
    "sample": (cli.main, "jetson-sample", [], {
        "--batch": ["0", "-1", "x"], "--steps": ["0", "1.5"], "--eta": ["nan", "inf", "-1"],
        "--seed": ["-1", str(2 ** 63), "x"], "--seeds": ["-2", "1.0"], "--nrow": ["-2", "x"],
        "--sms": ["0"], "--budget": ["lots", "inf", "0"]}),
    "bench": (runner.main, "jetson-bench", [], {
        "--batch": ["0"], "--steps": ["0"], "--eta": ["nan"], "--runs": ["0", "x"], "--warmup": ["-1"],
        "--seed": ["-1"], "--interval": ["0", "nan", "-1"], "--min-run-s": ["-1", "inf", "nan"], "--cold-timeout": ["0", "inf"],
        "--sms": ["0", "x"]}),
    "tune": (tune.main, "jetson-tune", [], {"--batch": ["0"], "--split-top": ["0", "x"], "--sms": ["0"]}),
    "weights random": (cli.weights_cli, "jetson-weights", ["random", "w.npz"], {"--seed": ["-1", "x"]}),
}
CASES = [(cli_name, flag, v) for cli_name, (_m, _p, _b, flags) in NUMBERS.items() for flag, vs in flags.items()
         for v in vs]


@pytest.mark.parametrize("cli_name, flag, value", CASES)
def test_every_numeric_option_is_refused_as_it_is_parsed(tmp_path, capsys, monkeypatch, no_work, cli_name, flag,
                                                         value):
    main, prog, base, _ = NUMBERS[cli_name]
    monkeypatch.chdir(tmp_path)
    assert main([*base, f"{flag}={value}"]) == 2
    line = one_error_line(capsys, prog)
    assert line.startswith(f"{prog}: error: {flag}") and value in line, line
    assert files_under(tmp_path) == []


def _parsers():
    weights = cli.weights_parser()
    sub = next(a for a in weights._actions if isinstance(a, argparse._SubParsersAction))
    return {"sample": cli.build_parser(), "bench": runner.build_parser(), "tune": tune.build_parser(),
            "weights": weights, "weights random": sub.choices["random"], "weights info": sub.choices["info"]}


def test_the_numeric_table_covers_every_typed_option():
    """A new numeric option without a validator, or without a case above, fails here."""
    for name, p in _parsers().items():
        for a in p._actions:
            assert a.type not in (int, float), f"{name} {a.option_strings}: a bare {a.type.__name__}"
            if a.type is not None:
                flags = NUMBERS[name][3]
                assert any(f in flags for f in a.option_strings), f"{name} {a.option_strings} has no case above"


def test_nrow_minus_two_fails_before_sampling_in_a_fresh_process(weights, tmp_path):
    """The issue's case: `--nrow -2` failed only after sampling, the whole run lost."""
    r = subprocess.run([sys.executable, "-m", "jetson_unet.cli", "--weights", weights, "--nrow", "-2",
                        "--out", str(tmp_path / "g.png")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 2 and r.stderr == "jetson-sample: error: --nrow must be >= 0, got -2\n", r.stderr
    assert files_under(tmp_path) == []


def test_make_grid_refuses_a_negative_nrow():
    with pytest.raises(UsageError, match="nrow must be >= 0"):
        cli.make_grid(np.zeros((2, 4, 4, 3), np.uint8), -1)


# ---- a full disk after the run: one line, exit 1, nothing of the set left --------------------------------

def test_sample_on_a_full_disk_leaves_no_grid_and_no_image(weights, tmp_path, capsys, monkeypatch):
    """The issue's case: `--save-each` on a full disk left the grid plus one of four images."""
    each = tmp_path / "each"
    each.mkdir()
    real, calls = cli.encode_png, []

    def encode(f, image):
        calls.append(1)
        if len(calls) == 3:   # the grid and image 0 written, image 1 hits the full disk
            raise ENOSPC
        real(f, image)

    monkeypatch.setattr(cli, "encode_png", encode)
    rc = cli.main(["--weights", weights, "--out", str(tmp_path / "g.png"), "--batch", "4", "--backend", "numpy",
                   "--sampler", "ddim", "--steps", "2", "--save-each", str(each), "--quiet"])
    line = one_error_line(capsys, "jetson-sample")
    assert rc == 1 and "no space left on device; nothing written" in line and "each/001.png" in line, line
    assert files_under(tmp_path) == ["each"]


class FakeTimeline:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def write(self, path, meta):
        if self.fail:
            raise ENOSPC
        Path(path).write_text('{"traceEvents": []}')


@pytest.mark.parametrize("fail", [False, True])
def test_grid_images_and_trace_land_together(tmp_path, fail):
    images = np.zeros((2, 4, 4, 3), np.uint8)
    args = (images, tmp_path / "g.png", 0, tmp_path, tmp_path / "t.json", FakeTimeline(fail), {})
    if fail:
        with pytest.raises(OutputError, match="t.json: no space left"):
            cli.write_outputs(*args)
        assert files_under(tmp_path) == []
    else:
        cli.write_outputs(*args)
        assert files_under(tmp_path) == ["000.png", "001.png", "g.png", "t.json"]


def test_weights_random_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    from jetson_unet.model import weights as weights_mod

    def full(*a, **kw):
        raise ENOSPC
    monkeypatch.setattr(weights_mod, "save_weights", full)
    assert cli.weights_cli(["random", str(tmp_path / "w.npz")]) == 1
    assert f"cannot write {tmp_path}/w.npz: no space left on device" in one_error_line(capsys, "jetson-weights")


def test_an_unexpected_oserror_is_one_line_exit_1(capsys):
    def boom(argv):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y")
    assert cli._run(boom, "prog", []) == 1
    assert one_error_line(capsys, "prog") == "prog: error: /x/y: No such file or directory"


def _bench_argv(weights, out):
    return ["--weights", weights, "--backend", "numpy", "--sampler", "ddim", "--steps", "2", "--runs", "1",
            "--warmup", "0", "--telemetry", "none", "--cold", "none", "--out", str(out), "--quiet"]


def test_a_failed_bench_leaves_no_output_folder(weights, tmp_path, capsys, monkeypatch):
    def fell_over(*a, **kw):
        raise RuntimeErrorBase("the GPU fell over")
    monkeypatch.setattr(runner, "run_grid", fell_over)
    assert runner.main(_bench_argv(weights, tmp_path / "out")) == 1
    assert "the GPU fell over" in one_error_line(capsys, "jetson-bench")
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("exists", [False, True])
def test_bench_on_a_full_disk_writes_none_of_its_files(weights, tmp_path, capsys, monkeypatch, exists):
    out = tmp_path / "out"
    if exists:
        out.mkdir()

    def full(rows, f):
        raise ENOSPC
    monkeypatch.setattr(report, "write_csv", full)
    assert runner.main(_bench_argv(weights, out)) == 1
    assert "bench.csv: no space left on device" in one_error_line(capsys, "jetson-bench", after_notes=True)
    assert files_under(tmp_path) == (["out"] if exists else [])


# ---- messages --------------------------------------------------------------------------------------

def test_trace_errors_name_trace(weights, tmp_path, capsys, no_work):
    assert cli.main(["--weights", weights, "--out", str(tmp_path / "g.png"), "--trace", "t.txt"]) == 2
    assert "error: --trace t.txt must end in .json" in one_error_line(capsys, "jetson-sample")


def test_trace_on_the_numpy_backend_is_refused_before_the_weights_load(weights, tmp_path, capsys, no_work):
    assert cli.main(["--weights", weights, "--out", str(tmp_path / "g.png"), "--trace", str(tmp_path / "t.json"),
                     "--backend", "numpy"]) == 2
    assert "--trace records the GPU's launches" in one_error_line(capsys, "jetson-sample")
    assert files_under(tmp_path) == []


def test_trace_where_auto_falls_back_to_numpy_is_refused_before_sampling(weights, tmp_path, capsys, monkeypatch):
    from jetson_unet.backends import gpu_available
    from jetson_unet.pipeline import Pipeline
    if gpu_available("cupy") is None or gpu_available("pycuda") is None:
        pytest.skip("a GPU is usable here: no fallback to observe")
    monkeypatch.setattr(Pipeline, "sample", work_started)
    assert cli.main(["--weights", weights, "--out", str(tmp_path / "g.png"), "--trace", str(tmp_path / "t.json"),
                     "--quiet"]) == 2
    assert "--trace records the GPU's launches" in one_error_line(capsys, "jetson-sample", after_notes=True)
    assert files_under(tmp_path) == []


def test_weights_without_a_subcommand_prints_its_help(capsys):
    assert cli.weights_cli([]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.startswith("usage: jetson-weights") and "random" in cap.err and "info" in cap.err
    assert "arguments are required" not in cap.err


@pytest.mark.parametrize("name", list(_parsers()))
def test_help_states_each_default_once_and_only_as_it_is(name):
    """No `(default: None)` beside a help text that says what the default does (`--seed`: default 0)."""
    p = _parsers()[name]
    fmt = p._get_formatter()
    for a in p._actions:
        if not a.help or a.help == argparse.SUPPRESS:
            continue
        text = fmt._expand_help(a)
        assert "(default: None)" not in text and "(default: False)" not in text, (name, a.option_strings, text)
        if "default" in a.help:
            assert text.count("default") == a.help.count("default"), (name, a.option_strings, text)
