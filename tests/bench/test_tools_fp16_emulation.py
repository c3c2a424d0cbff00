"""tools.lab.fp16_emulation on the CPU: with no rounding it is the float64 reference bit for bit, each
rounding's delta is what it claims (the sub-pixel form of an up2 conv, the folded weights' rounding),
and the command prints one line per seed."""
from __future__ import annotations

import numpy as np
import pytest

from jetson_unet.model import reference as R
from jetson_unet.ops.conv import subpixel_weights
from tools.lab import fp16_emulation as E


def test_no_rounding_is_the_float64_reference(tiny_weights):
    rng = np.random.default_rng(5)
    c = tiny_weights.config
    x = rng.standard_normal((1, c.channels, c.image_size, c.image_size))
    t = np.array([7])
    want = R.Reference(tiny_weights, np.float64).eps(x, t)
    assert np.array_equal(E.Fp16Emulation(tiny_weights, []).eps(x, t), want)
    got = E.Fp16Emulation(tiny_weights, ["outputs"]).eps(x, t)
    assert 0 < np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2   # fp16 storage: small, not zero


def test_subpixel_matrices_make_the_up2_conv():
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 5, 6, 7)), rng.standard_normal((4, 5, 3, 3))
    want = R.conv2d(R.up2(x), w, np.zeros(4))
    got = E.subpixel_delta(x, [m.astype(np.float64) for m in subpixel_weights(w)])
    assert np.abs(got - want).max() < 1e-5   # the matrices are summed in fp32


@pytest.mark.parametrize("rounding", ["fold", "subpixel", "prodscale"])
def test_each_rounding_moves_eps_a_little(tiny_weights, rounding):
    rng = np.random.default_rng(7)
    c = tiny_weights.config
    x = rng.standard_normal((1, c.channels, c.image_size, c.image_size))
    base = E.Fp16Emulation(tiny_weights, ["outputs"]).eps(x, np.array([3]))
    got = E.Fp16Emulation(tiny_weights, ["outputs", rounding]).eps(x, np.array([3]))
    assert 0 < np.linalg.norm(got - base) / np.linalg.norm(base) < 1e-2


def test_command_prints_a_line_per_seed(tiny_weights_path, tmp_path, capsys):
    ref = tmp_path / "fp64.npz"
    args = ["--weights", str(tiny_weights_path), "--seeds", "2", "3", "--sampler", "ddim", "--steps", "2"]
    assert E.main(args + ["--round", "--save", str(ref)]) == 0   # no rounding: the same images
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["seed 2 rounding nothing", "seed 3 rounding nothing"]
    assert all("inf dB" in line for line in out)
    assert E.main(args + ["--ref", str(ref), "--round", "outputs", "fold"]) == 0
    assert capsys.readouterr().out.count("rounding outputs+fold") == 2
    assert E.main(args[:2] + ["--seeds", "9", "--ref", str(ref)]) == 2
    assert "no image of seed 9" in capsys.readouterr().err
