"""tools.precision_psnr on the CPU: the numpy backend's fp32 images against its fp64 ones (the
tool's logic is the same on a GPU, where it compares fp16/bf16 with fp32)."""
from __future__ import annotations

import json
import math

import numpy as np

from tools import precision_psnr


def test_psnr_u8_known_values():
    a = np.zeros((4, 4, 3), np.uint8)
    b = a.copy()
    assert precision_psnr.psnr_u8(a, b) == math.inf
    b[0, 0, 0] = 255                        # MSE = 255^2 / 48
    assert abs(precision_psnr.psnr_u8(a, b) - 10 * math.log10(48)) < 1e-12


def test_fp32_against_fp64_per_seed(tiny_weights_path, tmp_path, capsys):
    out = tmp_path / "psnr.json"
    args = ["--weights", str(tiny_weights_path), "--backend", "numpy", "--base", "fp64", "--precisions", "fp32",
            "--seeds", "3", "4", "--sampler", "ddim", "--steps", "4", "--json", str(out)]
    assert precision_psnr.main(args) == 0
    text = capsys.readouterr().out
    assert "against the fp64 image of the same seed" in text and text.count("\n") == 6
    doc = json.loads(out.read_text())
    assert [r["seed"] for r in doc["rows"]] == [3, 4]
    for r in doc["rows"]:                   # fp32 rounding moves a pixel by at most one level here
        assert r["fp32_max_abs"] <= 1
        assert r["fp32_psnr_db"] == "inf" or r["fp32_psnr_db"] > 45
    # the two seeds are two different images: a seed mix-up would compare equal images to each other
    res = precision_psnr.compare(str(tiny_weights_path), "numpy", "fp64", ["fp32"], [3, 4], "ddim", 4)
    imgs = precision_psnr.images(str(tiny_weights_path), "numpy", "fp64", [3, 4], "ddim", 4)
    assert not np.array_equal(imgs[0], imgs[1]) and res["summary"]["fp32"]["min_db"] > 45


def test_fp64_base_runs_on_numpy_whatever_the_backend(tiny_weights_path):
    # `--base fp64` with a GPU backend: the float64 reference comes from NumPy (no GPU computes in fp64),
    # so a machine without a GPU makes it too, the same image as the numpy backend's
    got = precision_psnr.images(str(tiny_weights_path), "cupy", "fp64", [3], "ddim", 2)
    want = precision_psnr.images(str(tiny_weights_path), "numpy", "fp64", [3], "ddim", 2)
    assert np.array_equal(got[0], want[0])
