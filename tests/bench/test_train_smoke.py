"""The PyTorch tools: module names vs the plan, torch vs the reference, and a training smoke run.

Skipped where torch is not installed (it is a `train` extra; CI runs without it)."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from jetson_unet.model.config import UNetConfig
from jetson_unet.model.plan import param_shapes
from jetson_unet.model.reference import Reference
from jetson_unet.model.weights import Weights, load_weights, random_params
from tools.torch_unet import SeedUNet, load_numpy_params, n_params

ROOT = Path(__file__).resolve().parents[2]

ODD = UNetConfig(image_size=12, dim=6, dim_mults=(1, 2, 3), time_dim=20)


@pytest.mark.parametrize("cfg", [UNetConfig(), ODD], ids=["default", "odd"])
def test_state_dict_is_the_spec(cfg: UNetConfig) -> None:
    model = SeedUNet(cfg)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = {k: tuple(s) for k, s in param_shapes(cfg).items()}
    assert sorted(got) == sorted(want)
    assert got == want
    if cfg == UNetConfig():
        assert abs(n_params(model) - 15.9e6) < 0.05e6, n_params(model)


def test_torch_matches_reference_float64(rng) -> None:
    params = random_params(ODD, seed=5)
    model = SeedUNet(ODD).double()
    load_numpy_params(model, params)
    x = rng.standard_normal((3, 3, 12, 12)).astype(np.float32)
    t = np.array([99, 37, 0])
    with torch.no_grad():
        want = model(torch.from_numpy(x).double(), torch.from_numpy(t)).numpy()
    got = Reference(Weights("odd", ODD, params, {}), dtype=np.float64).eps(x, t)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-10


def run_train(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tools.train", "--smoke", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_smoke_train_export_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    common = ["--out", str(out), "--data", str(tmp_path / "none.npz")]   # synthetic images
    r = run_train(*common, "--steps", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    w = load_weights(out / "model.safetensors")
    assert (w.config.image_size, w.config.dim) == (16, 8)
    assert w.manifest["extra"]["steps"] == 3
    assert (out / "samples.png").is_file() and (out / "ckpt.pt").is_file()
    r = run_train(*common, "--steps", "5", "--resume")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "from step 3" in r.stdout
    with open(out / "loss.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["step"]) for row in rows] == [1, 2, 3, 4, 5]
    assert all(np.isfinite(float(row["loss"])) for row in rows)
    assert load_weights(out / "model.safetensors").manifest["extra"]["steps"] == 5


def test_bad_dataset_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros((4, 8, 8, 3), np.uint8))
    cmd = [sys.executable, "-m", "tools.train", "--data", str(bad), "--steps", "1",
           "--out", str(tmp_path / "o"), "--device", "cpu"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "images must be" in r.stderr, r.stderr
