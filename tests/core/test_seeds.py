"""One noise stream per image on the NumPy backend (spec: "Noise (reproducibility): one stream per
image"): an image depends on its own seed only, bit for bit, whatever the batch it is sampled in
and its position there.

The network is conftest's TINY with a 10-step schedule: DDPM always runs all T steps, and at the
spec's T = 100 this test would take ~40 s per sampler on a 2-core machine.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.conftest import TINY

from jetson_unet.errors import UsageError
from jetson_unet.model.config import Schedule
from jetson_unet.model.reference import Reference
from jetson_unet.model.schedule import make_steps, sample_loop
from jetson_unet.model.weights import load_weights, random_params, save_weights
from jetson_unet.pipeline import Pipeline

TINY10 = dataclasses.replace(TINY, schedule=Schedule(timesteps=10, beta_end=0.005))

# (sampler, steps, eta): DDPM and DDIM eta 1 draw noise at (almost) every step, so each image's own
# z matters; dpmpp-2m draws only x_T, at fewer steps than T (its history carries image by image)
SAMPLERS = [("ddpm", None, 0.0), ("ddim", 6, 1.0), ("dpmpp-2m", 5, 0.0)]


@pytest.fixture(scope="module")
def weights_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "tiny10.npz"
    save_weights(path, TINY10, random_params(TINY10, seed=11), dtype="float32")
    return path


@pytest.fixture(scope="module")
def pipe(weights_path):
    with Pipeline(weights_path, backend="numpy") as p:
        yield p


@pytest.mark.parametrize("sampler,steps,eta", SAMPLERS, ids=[s[0] for s in SAMPLERS])
def test_batch_images_equal_each_seed_alone(pipe, sampler, steps, eta):
    """sample(batch=4, seed=5) is sample(batch=1, seed=k) for k = 5..8, bit for bit."""
    kw = dict(sampler=sampler, steps=steps, eta=eta)
    batch = pipe.sample(batch=4, seed=5, **kw)
    assert batch.shape == (4, 16, 16, 3) and batch.dtype == np.uint8
    for i, k in enumerate(range(5, 9)):
        alone = pipe.sample(batch=1, seed=k, **kw)
        np.testing.assert_array_equal(batch[i], alone[0], err_msg=f"{sampler}: image {i} (seed {k})")
    assert len({batch[i].tobytes() for i in range(4)}) == 4, "four seeds, four images"


@pytest.mark.parametrize("sampler,steps,eta", SAMPLERS, ids=[s[0] for s in SAMPLERS])
def test_seed_lists_at_several_positions(pipe, sampler, steps, eta):
    """Seed 5 first, second, alone and repeated: the same image; seeds=[s..] equals seed=s."""
    kw = dict(sampler=sampler, steps=steps, eta=eta)
    a = pipe.sample(seeds=[9, 5], **kw)
    b = pipe.sample(seeds=[5], **kw)
    c = pipe.sample(seeds=[5, 7, 9], batch=3, **kw)
    d = pipe.sample(batch=2, seed=9, **kw)          # seeds 9, 10
    assert a.shape[0] == 2 and b.shape[0] == 1 and c.shape[0] == 3
    np.testing.assert_array_equal(a[1], b[0], err_msg="seed 5 second of two vs alone")
    np.testing.assert_array_equal(c[0], b[0], err_msg="seed 5 first of three vs alone")
    np.testing.assert_array_equal(c[2], a[0], err_msg="seed 9 last of three vs first of two")
    np.testing.assert_array_equal(d[0], a[0], err_msg="seed=9 vs seeds=[9, ..]")
    e = pipe.sample(seeds=[5, 5], **kw)
    np.testing.assert_array_equal(e[0], b[0])
    np.testing.assert_array_equal(e[1], b[0])


def test_x0_bits_do_not_depend_on_the_batch(weights_path):
    """Below the uint8 rounding (random weights saturate most pixels): the float32 x_0 of each image
    is the same bits alone and in a batch, with the Pipeline's own engine (Reference, fp32)."""
    w = load_weights(weights_path)
    ref = Reference(w, np.float32)
    shape = (3, TINY10.channels, TINY10.image_size, TINY10.image_size)
    for sampler, steps, eta in SAMPLERS[:1] + SAMPLERS[2:]:
        plan = make_steps(TINY10.schedule, sampler, steps, eta)
        batch = sample_loop(ref.eps, shape, plan, [8, 3, 6])
        for i, s in enumerate([8, 3, 6]):
            alone = sample_loop(ref.eps, (1,) + shape[1:], plan, [s])
            assert np.array_equal(batch[i].view(np.uint32), alone[0].view(np.uint32)), f"{sampler}: seed {s}"


def test_seeds_and_batch_must_agree(pipe):
    with pytest.raises(UsageError, match="2 seeds for a batch of 3"):
        pipe.sample(seeds=[1, 2], batch=3)
    assert pipe.sample(seeds=[1, 2], batch=2, sampler="dpmpp-2m", steps=2).shape[0] == 2
