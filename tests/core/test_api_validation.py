"""The Python API checks every argument at its edge: a wrong type or range raises UsageError (what
the CLI exits 2 for) with one line naming the parameter, before any work; never a raw TypeError
from deep inside. Every parameter of Pipeline(), load() and sample(), with the classes of wrong
values: str for numbers, bool for integers, floats for integers, NaN and infinities, out of range,
None where a value is needed, unhashable and array values for choices."""
from __future__ import annotations

import math

import numpy as np
import pytest

from jetson_unet import Pipeline, cli
from jetson_unet.errors import UsageError
from jetson_unet.ops.policy import KernelPolicy

NAN, INF = float("nan"), float("inf")
BIG = 10 ** 400   # no float holds it


@pytest.fixture(scope="module")
def pipe(tiny_weights):
    with Pipeline(tiny_weights, backend="numpy") as p:
        yield p


@pytest.fixture
def no_sampling(monkeypatch):
    """A refused call must not reach the sampling loop."""
    def refuse(*a, **k):
        raise AssertionError("sampling started")
    monkeypatch.setattr("jetson_unet.pipeline.sample_loop", refuse)


def refused(call, needle: str) -> str:
    with pytest.raises(UsageError, match=needle) as ei:
        call()
    msg = str(ei.value)
    assert "\n" not in msg, msg
    return msg


CONSTRUCTOR = [
    ("weights", 5, "^weights must be a path"), ("weights", 2.5, "^weights must be a path"),
    ("weights", ["w.npz"], "^weights must be a path"), ("weights", b"w.npz", "^weights must be a path"),
    ("backend", "gpu", "^unknown backend 'gpu'"), ("backend", None, "^unknown backend None"),
    ("backend", 5, "^unknown backend 5"), ("backend", ["numpy"], r"^unknown backend \['numpy'\]"),
    ("backend", np.array(["numpy"]), "^unknown backend array"),
    ("precision", "fp8", "^unknown precision 'fp8'"), ("precision", None, "^unknown precision None"),
    ("precision", 16, "^unknown precision 16"), ("precision", True, "^unknown precision True"),
    ("mode", "fast", "^unknown mode 'fast'"), ("mode", None, "^unknown mode None"), ("mode", 1, "^unknown mode 1"),
    ("noise", "gpu", "^unknown noise source 'gpu'"), ("noise", None, "^unknown noise source None"),
    ("noise", 0, "^unknown noise source 0"),
    ("graphs", "no", "^graphs must be True or False, got 'no'"), ("graphs", 1, "^graphs must be True or False, got 1"),
    ("graphs", None, "^graphs must be True or False"), ("graphs", 0.0, "^graphs must be True or False"),
    ("policy", None, "^policy must be a jetson_unet.ops.policy.KernelPolicy"),
    ("policy", "builtin", "^policy must be a jetson_unet.ops.policy.KernelPolicy"),
]


@pytest.mark.parametrize("name,value,needle", CONSTRUCTOR, ids=[f"{n}={v!r}" for n, v, _ in CONSTRUCTOR])
def test_constructor_refuses(tiny_weights, name, value, needle):
    kw = {"weights": tiny_weights, "backend": "numpy", name: value}
    refused(lambda: Pipeline(**kw), needle)


INTEGER_CLASSES = [("4", "an integer, got '4'"), (True, "an integer, got True"), (False, "an integer, got False"),
                   (2.0, r"an integer, got 2\.0"), (1.5, r"an integer, got 1\.5"), (NAN, "an integer, got nan"),
                   (INF, "an integer, got inf"), (np.float64(2), "an integer"), ([2], r"an integer, got \[2\]")]

SAMPLE = (
    [("batch", v, f"^batch must be {n}") for v, n in INTEGER_CLASSES]
    + [("batch", 0, "^batch must be >= 1, got 0"), ("batch", -3, "^batch must be >= 1, got -3")]
    + [("steps", v, f"^steps must be {n}") for v, n in INTEGER_CLASSES]
    + [("steps", 1, r"^dpmpp-2m steps must be in 2\.\.100"), ("steps", 0, r"^dpmpp-2m steps must be in 2\.\.100"),
       ("steps", -1, "steps must be in"), ("steps", 101, "steps must be in"), ("steps", BIG, "steps must be in")]
    + [("seed", v, f"^seed must be {n}") for v, n in INTEGER_CLASSES if not isinstance(v, str)]
    + [("seed", "abc", "^seed must be an integer, got 'abc'"), ("seed", None, "^seed must be an integer, got None"),
       ("seed", -1, r"^seed -1 \(batch 1\): seeds are integers 0 <= s < 2\*\*63, got -1"),
       ("seed", 2 ** 63, r"^seed 9223372036854775808 \(batch 1\): seeds are integers"),
       ("seed", BIG, r"^seed 1000.*0 \(batch 1\): seeds are integers")]
    + [("seeds", 5, "^seeds must be a sequence of integers, got 5"),
       ("seeds", "abc", "^seeds must be a sequence of integers, got 'abc'"),
       ("seeds", [1, "a"], "^seeds are integers 0 <= s < 2\\*\\*63, got 'a'"),
       ("seeds", [True], "^seeds are integers .*, got True"), ("seeds", [-1], "^seeds are integers .*, got -1"),
       ("seeds", [2 ** 63], "^seeds are integers .*, got 9223372036854775808"),
       ("seeds", [1.5], r"^seeds are integers .*, got 1\.5"), ("seeds", np.array([1.0]), "^seeds are integers"),
       ("seeds", [NAN], "^seeds are integers .*, got nan"), ("seeds", [], "^seeds must name at least one image")]
    + [("eta", "0", "^eta must be a number, got '0'"), ("eta", None, "^eta must be a number, got None"),
       ("eta", True, "^eta must be a number, got True"), ("eta", [0.0], "^eta must be a number"),
       ("eta", NAN, "^eta must be a finite number, got nan"), ("eta", INF, "^eta must be a finite number, got inf"),
       ("eta", -INF, "^eta must be a finite number, got -inf"), ("eta", BIG, "^eta must be a finite number, got 1000"),
       ("eta", np.float32(NAN), "^eta must be a finite number"), ("eta", 0.5, "^eta goes with --sampler ddim")]
    + [("sampler", None, "^sampler must be a string"), ("sampler", 5, "^sampler must be a string"),
       ("sampler", ["ddim"], "^sampler must be a string"), ("sampler", "euler", "^unknown sampler 'euler'")]
    + [("callback", 5, r"^callback must be callable as callback\(step, n_steps\), got 5"),
       ("callback", "print", "^callback must be callable")]
)


@pytest.mark.parametrize("name,value,needle", SAMPLE, ids=[f"{n}={v!r}"[:40] for n, v, _ in SAMPLE])
def test_sample_refuses(pipe, no_sampling, name, value, needle):
    refused(lambda: pipe.sample(**{name: value}), needle)


@pytest.mark.parametrize("kw,needle", [
    ({"seed": 2 ** 63 - 1, "batch": 2}, r"^seed 9223372036854775807 \(batch 2\): seeds are integers .*, got "
                                        r"9223372036854775808"),
    ({"seeds": [1, 2], "batch": 3}, "^2 seeds for a batch of 3: give one per image"),
    ({"seeds": [1, 2], "batch": "2"}, "^batch must be an integer, got '2'"),
    ({"sampler": "ddpm", "steps": 5}, "^DDPM runs all 100 steps"),
    ({"sampler": "ddim", "steps": 0}, r"^DDIM steps must be in 1\.\.100, got 0"),
    ({"sampler": "ddim", "eta": -0.5}, "^eta must be a finite number >= 0, got -0.5"),
])
def test_sample_refuses_combinations(pipe, no_sampling, kw, needle):
    refused(lambda: pipe.sample(**kw), needle)


LOAD = ([(v, f"^batch must be {n}") for v, n in INTEGER_CLASSES if not isinstance(v, list)]
        + [(0, "^batch must be >= 1, got 0"), (-1, "^batch must be >= 1, got -1"),   # sizes: each an integer
           ([2, 1.5], r"^batch must be an integer, got 1\.5"), ([4, 0], "^batch must be >= 1, got 0"),
           ([], "^batch must name at least one batch size"), (np.array([1, -2]), "^batch must be >= 1, got -2")])


@pytest.mark.parametrize("value,needle", LOAD)
def test_load_refuses(pipe, value, needle):
    refused(lambda: pipe.load(value), needle)


def test_good_values_of_every_kind_pass(pipe):
    """NumPy integers and floats are numbers too; a seed's images are its own whatever the spelling."""
    a = pipe.sample(batch=np.int64(2), steps=np.int32(2), seed=np.uint8(3), eta=np.float32(0.0))
    b = pipe.sample(seeds=np.array([3, 4]), steps=2)
    c = pipe.sample(seeds=(3, 4), batch=2, steps=2, sampler="ddim", eta=0)
    assert a.shape == (2, 16, 16, 3) and np.array_equal(a, b)
    assert c.shape == a.shape
    assert pipe.load(np.int64(2)) is pipe
    with Pipeline(pipe.weights, backend="numpy", graphs=np.bool_(False), policy=KernelPolicy()) as p:
        assert p.graphs is False


def test_closed_pipeline_refuses(tiny_weights):
    p = Pipeline(tiny_weights, backend="numpy")
    p.close()
    refused(lambda: p.sample(steps=2), "^this Pipeline is closed$")
    refused(lambda: p.load(1), "^this Pipeline is closed$")


def test_no_path_finds_the_shipped_model(tmp_path, monkeypatch):
    """Pipeline() from any folder: the README's example."""
    from jetson_unet.pipeline import default_weights_path
    if not default_weights_path().is_file():
        pytest.skip("no shipped model")
    monkeypatch.chdir(tmp_path)
    with Pipeline(backend="numpy") as p:
        assert p.weights.path == str(default_weights_path())


# ---- the CLI alike: the same class of value, the same typed error, exit 2 and one line --------------------
@pytest.mark.parametrize("argv,flag", [
    (["--batch", "0"], "--batch"), (["--batch", "x"], "--batch"), (["--batch", "1.5"], "--batch"),
    (["--steps", "0"], "--steps"), (["--steps", "nan"], "--steps"), (["--eta", "nan"], "--eta"),
    (["--eta", "inf"], "--eta"), (["--eta", "-1"], "--eta"), (["--eta", "x"], "--eta"),
    (["--seed", "-1"], "--seed"), (["--seed", "abc"], "--seed"), (["--seed", str(2 ** 63)], "--seed"),
    (["--seeds", "1", "x"], "--seeds"), (["--nrow", "-1"], "--nrow"),
])
def test_cli_numbers_alike(tiny_weights_path, tmp_path, capsys, no_sampling, argv, flag):
    out = tmp_path / "grid.png"
    rc = cli.main(["--weights", str(tiny_weights_path), "--backend", "numpy", "--out", str(out), "--quiet"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0], err
    assert not out.exists()


def test_values_are_shown_short(pipe):
    msg = refused(lambda: pipe.sample(eta=BIG), "^eta must be a finite number")
    assert len(msg) < 100 and math.isfinite(len(msg))
