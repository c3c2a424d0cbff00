"""jetson-sample / jetson-weights end to end on a tiny random model (CPU, NumPy backend)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from jetson_unet import cli
from jetson_unet.model.config import Schedule, UNetConfig
from jetson_unet.errors import Cancelled, UsageError
from jetson_unet.pipeline import Pipeline
from jetson_unet.model.weights import random_params, save_weights

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32, schedule=Schedule(timesteps=10, beta_end=0.005))


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "tiny.npz"
    save_weights(path, TINY, random_params(TINY, seed=3))
    return str(path)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jetson_unet.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_sample_writes_png_grid_and_each(tiny_weights, tmp_path):
    out, each = tmp_path / "grid.png", tmp_path / "each"
    each.mkdir()
    rc = cli.main(["--weights", tiny_weights, "--out", str(out), "--batch", "3", "--backend", "numpy",
                   "--save-each", str(each), "--quiet"])
    assert rc == 0
    grid = np.asarray(Image.open(out))
    assert grid.shape == (2 * 18 + 2, 2 * 18 + 2, 3), "2x2 grid of 16 px images with 2 px padding"
    files = sorted(p.name for p in each.iterdir())
    assert files == ["000.png", "001.png", "002.png"]
    first = np.asarray(Image.open(each / "000.png"))
    np.testing.assert_array_equal(grid[2:18, 2:18], first)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"], "no temporary file left behind"


def test_same_seed_same_images_and_other_seed_differs(tiny_weights):
    with Pipeline(tiny_weights, backend="numpy") as pipe:
        a = pipe.sample(batch=2, seed=7)
        b = pipe.sample(batch=2, seed=7)
        c = pipe.sample(batch=2, seed=8)
    assert a.shape == (2, 16, 16, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_ddim_and_callback_cancel(tiny_weights):
    seen = []

    def cb(i, n):
        seen.append((i, n))
        if i == 2:
            raise Cancelled("stop at step 2")

    with Pipeline(tiny_weights, backend="numpy") as pipe:
        img = pipe.sample(batch=1, steps=4, sampler="ddim", seed=1)
        assert img.shape == (1, 16, 16, 3)
        with pytest.raises(Cancelled):
            pipe.sample(batch=1, seed=1, sampler="ddpm", callback=cb)
    assert seen == [(0, 10), (1, 10), (2, 10)]


@pytest.mark.parametrize("args, needle", [
    (["--batch", "0"], "--batch must be >= 1"),
    (["--out", "x.jpg"], "must end in .png"),
    (["--out", "/nonexistent-dir/x.png"], "--out /nonexistent-dir/x.png: folder /nonexistent-dir does not exist"),
    (["--sampler", "euler"], "invalid choice"),
    (["--sampler", "dpmpp_2m"], "invalid choice"),
    (["--sampler", "ddpm", "--steps", "5"], "DDPM runs all 10 steps"),
    (["--sampler", "ddim", "--steps", "99"], "DDIM steps must be in 1..10"),
    (["--sampler", "ddim", "--steps", "11"], "DDIM steps must be in 1..10"),
    (["--sampler", "dpmpp-2m", "--steps", "11"], "dpmpp-2m steps must be in 2..10"),
    (["--steps", "99"], "dpmpp-2m steps must be in 2..10"),   # the default sampler
    (["--sampler", "dpmpp-2m", "--steps", "1"], "dpmpp-2m steps must be in 2..10"),
    (["--sampler", "dpmpp-2m", "--steps", "0"], "--steps must be >= 1, got 0"),   # at parse time
    (["--sampler", "dpmpp-2m", "--eta", "0.5"], "eta goes with --sampler ddim"),
    (["--eta", "1"], "eta goes with --sampler ddim"),
    (["--sampler", "ddpm", "--eta", "1"], "eta goes with --sampler ddim"),
    (["--sampler", "ddim", "--eta", "nan"], "--eta must be a finite number >= 0"),
    (["--sampler", "ddim", "--eta", "inf"], "--eta must be a finite number >= 0"),
    (["--sampler", "ddim", "--eta", "-0.5"], "--eta must be a finite number >= 0"),
    (["--seed", "-1"], "--seed: seeds are integers 0 <= s < 2**63"),
    (["--seed", str(2 ** 63)], "--seed: seeds are integers 0 <= s < 2**63"),
    (["--seed", str(2 ** 63 - 1), "--batch", "2"], "seeds are integers 0 <= s < 2**63"),   # image 1: 2**63
    (["--seeds", "1", "2", "--batch", "3"], "2 seeds for a batch of 3"),
    (["--seeds", "1", "2", "3", "--batch", "1"], "3 seeds for a batch of 1"),
    (["--seeds", "4", "-1"], "seeds are integers 0 <= s < 2**63"),
    (["--seeds", "4", str(2 ** 63)], "seeds are integers 0 <= s < 2**63"),
    (["--backend", "numpy", "--precision", "fp16"], "numpy backend computes in fp32 or fp64"),
    (["--noise", "device", "--mode", "cpu"], "device noise goes with a GPU backend in gpu mode"),
    (["--noise", "device", "--backend", "numpy"], "device noise goes with a GPU backend in gpu mode"),
])
def test_usage_errors_exit_2_one_line(tiny_weights, tmp_path, args, needle):
    base = ["--weights", tiny_weights, "--out", str(tmp_path / "o.png"), "--quiet"]
    r = run_cli(*base, *args)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o.png").exists()


def test_pipeline_seeds_and_batch_must_agree(tiny_weights):
    with Pipeline(tiny_weights, backend="numpy") as pipe:
        for kw in (dict(seeds=[1, 2], batch=3), dict(seeds=[1, 2], batch=1), dict(seeds=[]),
                   dict(seeds=[-1]), dict(seeds=[2 ** 63]), dict(seed=-1), dict(seed=2 ** 63),
                   dict(seed=2 ** 63 - 1, batch=2), dict(batch=0), dict(sampler="euler"),
                   dict(sampler="dpmpp-2m", steps=1), dict(sampler="dpmpp-2m", steps=11),
                   dict(sampler="ddim", steps=11), dict(sampler="ddpm", steps=5),
                   dict(sampler="dpmpp-2m", eta=0.5), dict(sampler="ddim", eta=float("nan"))):
            with pytest.raises(UsageError):
                pipe.sample(**kw)


def _pngs(folder):
    return [np.asarray(Image.open(p)) for p in sorted(folder.iterdir())]


def test_cli_seed_batch_equals_seed_list(tiny_weights, tmp_path):
    """--seed 5 --batch 4 draws images 5, 6, 7, 8: the same PNG pixels as --seeds 5 6 7 8, and image 2
    is --seeds 7 alone (DDPM: noise at every step, so each image's own stream matters)."""
    runs = {"seed": ["--seed", "5", "--batch", "4"], "seeds": ["--seeds", "5", "6", "7", "8"],
            "seeds-batch": ["--seeds", "5", "6", "7", "8", "--batch", "4"], "one": ["--seeds", "7"]}
    got = {}
    for name, args in runs.items():
        each = tmp_path / name
        each.mkdir()
        rc = cli.main(["--weights", tiny_weights, "--out", str(tmp_path / f"{name}.png"), "--backend", "numpy",
                       "--sampler", "ddpm", "--save-each", str(each), "--quiet", *args])
        assert rc == 0
        got[name] = _pngs(each)
    assert len(got["seed"]) == 4 and len(got["one"]) == 1
    for name in ("seeds", "seeds-batch"):
        assert all(np.array_equal(a, b) for a, b in zip(got["seed"], got[name])) and len(got[name]) == 4, name
    np.testing.assert_array_equal(got["one"][0], got["seed"][2])
    assert not np.array_equal(got["seed"][0], got["seed"][1]), "two seeds, two images"
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "seed.png")),
                                  np.asarray(Image.open(tmp_path / "seeds.png")))


def test_bad_weights_file_exit_2_names_file(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip at all")
    r = run_cli("--weights", str(bad), "--out", str(tmp_path / "o.png"))
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.png").exists()


def test_help_shows_every_default():
    r = run_cli("--help")
    assert r.returncode == 0
    for flag in ("--weights", "--out", "--batch", "--steps", "--sampler", "--eta", "--seed", "--seeds", "--backend",
                 "--precision", "--noise"):
        assert flag in r.stdout
    text = " ".join(r.stdout.split())
    assert "(default: dpmpp-2m)" in text and "(default: samples.png)" in text and "(default: 0.0)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_weights_cli_random_and_info(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY.to_dict()))
    out = tmp_path / "r.npz"
    assert cli.weights_cli(["random", str(out), "--config", str(cfg), "--seed", "2", "--dtype", "float16"]) == 0
    r = subprocess.run([sys.executable, "-c", "from jetson_unet.cli import weights_cli; import sys; "
                        f"sys.exit(weights_cli(['info', {str(out)!r}]))"], capture_output=True, text=True)
    assert r.returncode == 0 and "float16" in r.stdout and "sha256:" in r.stdout


def test_auto_backend_falls_back_with_notice(tiny_weights, notes):
    with Pipeline(tiny_weights, backend="auto") as pipe:
        if pipe.backend != "numpy":
            pytest.skip("a GPU is usable here: no fallback to observe")
        assert pipe.precision == "fp32"
        assert pipe.noise == "host"   # the default noise source (auto) is device only with CuPy in gpu mode
    assert [n for n in notes if "NumPy reference backend" in n] == notes[-1:]
    assert len(notes[-1]) < 80, "one short line; the reasons go to -v (debug)"
