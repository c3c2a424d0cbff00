"""The NumPy reference against the PyTorch twin (tools/torch_unet.py), with no torch here.

tools/make_parity_fixture.py ran torch in float64 and stored its eps; here the reference runs the
same x and t. Two fixtures:
- parity_random.npz: random_params of a small config (rebuilt here from its seed), always runs;
- parity.npz: the shipped model weights/seed-unet-emoji64.safetensors, skipped where it is absent.

Tolerances (relative L2 per timestep group, ||ref - torch|| / ||torch||), written once:
- float64: 1e-10. Both sides are float64 end to end; they differ only in summation order
  (im2col matmul vs cuDNN-style direct conv), ~1e-15 measured.
- float32: 1e-5. float32 rounding through ~60 layers; torch float32 vs float64 measures ~5e-7.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jetson_unet.model.config import UNetConfig
from jetson_unet.model.reference import Reference
from jetson_unet.model.weights import Weights, content_hash, load_weights, random_params

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHIPPED = ROOT / "weights" / "seed-unet-emoji64.safetensors"
REL_TOL = {np.float32: 1e-5, np.float64: 1e-10}
REGENERATE = "python -m tools.make_parity_fixture"


def load_fixture(name: str) -> dict:
    path = FIXTURES / name
    if not path.is_file():
        pytest.skip(f"{path.relative_to(ROOT)} is missing: make it with {REGENERATE} (needs torch)")
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def random_weights(fx: dict) -> Weights:
    cfg = UNetConfig.from_dict(json.loads(str(fx["config"])))
    params = random_params(cfg, seed=int(fx["random_seed"]))
    digest = content_hash(params)
    assert digest == str(fx["content_hash"]), (
        f"random_params changed since the fixture was made: regenerate with {REGENERATE} --random-seed "
        f"{int(fx['random_seed'])}")
    return Weights("random", cfg, params, {"content_hash": digest})


def shipped_weights(fx: dict) -> Weights:
    if not SHIPPED.is_file():
        pytest.skip(f"{SHIPPED.relative_to(ROOT)} is not shipped in this checkout")
    w = load_weights(SHIPPED)
    assert w.manifest["content_hash"] == str(fx["content_hash"]), (
        f"tests/fixtures/parity.npz was made from other weights: regenerate with "
        f"{REGENERATE} --weights {SHIPPED.relative_to(ROOT)}")
    return w


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("which", ["random", "shipped"])
def test_reference_matches_torch(which: str, dtype) -> None:
    fx = load_fixture("parity_random.npz" if which == "random" else "parity.npz")
    weights = random_weights(fx) if which == "random" else shipped_weights(fx)
    ref = Reference(weights, dtype=dtype)
    x, t, want = fx["x"], fx["t"], fx["eps"]
    assert x.dtype == np.float32 and want.dtype == np.float64 and x.shape == want.shape
    for g in range(len(t)):   # one group per row of timesteps, so a failure names its t
        got = ref.eps(x[g], t[g])
        assert got.shape == want[g].shape, f"t={t[g].tolist()}: shape {got.shape} != {want[g].shape}"
        assert got.dtype == np.dtype(dtype), f"t={t[g].tolist()}: dtype {got.dtype}"
        rel = np.linalg.norm(got.astype(np.float64) - want[g]) / np.linalg.norm(want[g])
        assert rel < REL_TOL[dtype], (
            f"{which} weights, t={t[g].tolist()}, {np.dtype(dtype).name}: relative L2 {rel:.3g} "
            f">= {REL_TOL[dtype]:g}")
