"""Weights format: round trip, and every validation case with its typed error.

Bad files are built by hand (np.savez plus a manifest constructed here, hashed with
`file_hash`), so each case has exactly one defect and the error must name it: the file and,
where a tensor is at fault, the first offending tensor in the plan's order.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jetson_unet.model.config import UNetConfig
from jetson_unet.errors import (WeightsDtypeError, WeightsError, WeightsFileError, WeightsFormatError,
                                WeightsHashError, WeightsNameError, WeightsShapeError, WeightsValueError)
from jetson_unet.model.plan import build_plan, param_shapes
from jetson_unet.model.weights import (MANIFEST_KEY, content_hash, file_hash, load_weights, random_params,
                                       save_weights)

# The conftest's tiny config, spelled out (conftest is not importable under every import mode).
TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
NAMES = list(param_shapes(TINY))          # plan order: "first offending tensor" refers to it


@pytest.fixture
def params(rng) -> dict:
    """Valid float32 params of TINY with fresh random values (not random_params' init)."""
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in param_shapes(TINY).items()}


def manifest_for(arrays: dict, dtype: str = "float32", cfg: UNetConfig = TINY, **override) -> dict:
    """A valid manifest of `arrays`, then `override`; hashed after the override (a defect in a field
    is then that defect, not a hash mismatch) unless the override sets content_hash itself."""
    m = {"format": "seed-unet-weights", "format_version": 1, "config": cfg.to_dict(),
         "schedule": cfg.to_dict()["schedule"], "param_dtype": dtype,
         "n_params": build_plan(cfg).n_params}
    m.update(override)
    m.setdefault("content_hash", file_hash(m, arrays))
    return m


def write_npz(path: Path, manifest, arrays: dict) -> Path:
    kw = dict(arrays)
    if manifest is not None:
        kw[MANIFEST_KEY] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    with open(path, "wb") as f:       # a file object: np.savez must not append ".npz"
        np.savez(f, **kw)
    return path


def load_error(path: Path, cls: type, tensor=None) -> WeightsError:
    """load_weights(path) must raise exactly `cls`, naming the file and `tensor`."""
    with pytest.raises(WeightsError) as info:
        load_weights(path)
    e = info.value
    assert type(e) is cls, f"{type(e).__name__} raised, {cls.__name__} expected: {e}"
    assert e.path == str(path) and str(path) in str(e), f"error does not name the file: {e}"
    assert e.tensor == tensor, f"error names tensor {e.tensor!r}, expected {tensor!r}: {e}"
    if tensor:
        assert repr(tensor) in str(e), f"message does not name {tensor!r}: {e}"
    return e


def test_config_is_the_shared_one(tiny_config):
    assert TINY == tiny_config


# ---- round trip --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_round_trip(tmp_path, params, dtype):
    path = tmp_path / "w.npz"
    manifest = save_weights(path, TINY, params, dtype=dtype)
    w = load_weights(path)
    assert w.config == TINY and w.path == str(path)
    assert list(w.params) == NAMES, "params come back in plan order"
    for name in NAMES:
        got, want = w.params[name], params[name].astype(dtype)
        assert got.shape == want.shape, f"{name}: shape"
        assert got.dtype == np.dtype(dtype), f"{name}: dtype {got.dtype}"
        assert np.array_equal(got, want), f"{name}: values"
    assert w.manifest == manifest
    assert (manifest["format"], manifest["format_version"], manifest["param_dtype"]) == \
        ("seed-unet-weights", 1, dtype)
    assert manifest["content_hash"] == file_hash(manifest, w.params) and manifest["content_hash"].startswith("sha256:")
    assert manifest["n_params"] == sum(a.size for a in params.values())
    assert UNetConfig.from_dict(manifest["config"]) == TINY and w.param_dtype == dtype


def test_round_trip_odd_config(tmp_path, odd_config):
    p = random_params(odd_config, seed=5)
    save_weights(tmp_path / "odd.npz", odd_config, p)
    w = load_weights(tmp_path / "odd.npz")
    assert w.config == odd_config and all(np.array_equal(w.params[n], p[n]) for n in p)


def test_hand_built_file_loads(tmp_path, params):
    """The helpers here build valid files, so each failure case below has exactly one defect."""
    w = load_weights(write_npz(tmp_path / "ok.npz", manifest_for(params), params))
    assert w.config == TINY and list(w.params) == NAMES


def test_random_params_deterministic():
    a, b, c = random_params(TINY, seed=3), random_params(TINY, seed=3), random_params(TINY, seed=4)
    assert list(a) == NAMES
    assert all(np.array_equal(a[n], b[n]) for n in NAMES), "same seed, same values"
    assert all(not np.array_equal(a[n], c[n]) for n in NAMES), "another seed, other values"
    h = random_params(TINY, seed=3, dtype="float16")
    assert all(h[n].dtype == np.float16 and h[n].shape == param_shapes(TINY)[n] for n in NAMES)


# ---- unreadable files --------------------------------------------------------------------------

def test_missing_file(tmp_path):
    load_error(tmp_path / "absent.npz", WeightsFileError)


def test_not_a_zip(tmp_path, rng):
    path = tmp_path / "noise.npz"
    path.write_bytes(rng.bytes(4096))
    load_error(path, WeightsFileError)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.npz"
    path.write_bytes(b"")
    load_error(path, WeightsFileError)


@pytest.mark.parametrize("cut", ["last-bytes", "half", "middle-chunk"])
def test_truncated(tmp_path, params, cut):
    good = tmp_path / "good.npz"
    save_weights(good, TINY, params)
    data = good.read_bytes()
    n = len(data)
    bad = {"last-bytes": data[:-20], "half": data[: n // 2],
           "middle-chunk": data[: n // 2] + data[n // 2 + 1000:]}[cut]
    path = tmp_path / "cut.npz"
    path.write_bytes(bad)
    load_error(path, WeightsFileError)


def test_object_array_is_rejected_not_unpickled(tmp_path, params):
    """allow_pickle is never needed: an object array must fail before anything is unpickled."""
    sentinel = tmp_path / "unpickled"
    arrays = dict(params)
    arrays[NAMES[4]] = np.array([_Trap(str(sentinel))], dtype=object)
    path = write_npz(tmp_path / "pickle.npz", manifest_for(params), arrays)
    with pytest.raises(WeightsError) as info:
        load_weights(path)
    assert str(path) in str(info.value)
    assert not sentinel.exists(), "the object array was unpickled"


class _Trap:
    """Unpickling this creates a file: proof that the loader unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


# ---- manifest ----------------------------------------------------------------------------------

def test_manifest_missing(tmp_path, params):
    load_error(write_npz(tmp_path / "m.npz", None, params), WeightsFormatError)


def test_manifest_not_json(tmp_path, params):
    path = tmp_path / "m.npz"
    with open(path, "wb") as f:
        np.savez(f, **{MANIFEST_KEY: np.frombuffer(b"{not json", dtype=np.uint8)}, **params)
    load_error(path, WeightsFormatError)


@pytest.mark.parametrize("override", [
    {"format_version": 2}, {"format_version": 0}, {"format_version": "1"}, {"format_version": None},
    {"format": "other-weights"},
])
def test_wrong_format(tmp_path, params, override):
    load_error(write_npz(tmp_path / "v.npz", manifest_for(params, **override), params), WeightsFormatError)


@pytest.mark.parametrize("config", [
    dict(TINY.to_dict(), image_size=15),                    # not divisible by 2
    dict(TINY.to_dict(), arch="other-unet"),
    dict(TINY.to_dict(), depth=3),                          # unknown field
    dict(TINY.to_dict(), dim=7),                            # odd dim
    dict(TINY.to_dict(), schedule={"kind": "cosine"}),
    None,
    [1, 2],
], ids=["size", "arch", "unknown-field", "odd-dim", "schedule", "null", "list"])
def test_invalid_config(tmp_path, params, config):
    load_error(write_npz(tmp_path / "c.npz", manifest_for(params, config=config), params), WeightsFormatError)


@pytest.mark.parametrize("dtype", ["float64", "int8", None])
def test_invalid_param_dtype_in_manifest(tmp_path, params, dtype):
    load_error(write_npz(tmp_path / "d.npz", manifest_for(params, param_dtype=dtype), params), WeightsFormatError)


# ---- tensors -----------------------------------------------------------------------------------

def test_missing_parameter(tmp_path, params):
    arrays = {n: a for n, a in params.items() if n not in (NAMES[3], NAMES[17])}
    load_error(write_npz(tmp_path / "n.npz", manifest_for(arrays), arrays), WeightsNameError, NAMES[3])


def test_unexpected_parameter(tmp_path, params, rng):
    arrays = dict(params, **{"downs.0.block1.extra.weight": rng.standard_normal(4).astype(np.float32)})
    load_error(write_npz(tmp_path / "u.npz", manifest_for(arrays), arrays), WeightsNameError,
               "downs.0.block1.extra.weight")


def test_wrong_shape(tmp_path, params):
    first, second = "downs.0.block1.conv1.weight", "init_conv.weight"   # init_conv comes first in plan order
    assert NAMES.index(second) < NAMES.index(first)
    arrays = dict(params)
    arrays[first] = params[first].transpose(1, 0, 2, 3).copy()
    arrays[second] = params[second][:, :2].copy()
    load_error(write_npz(tmp_path / "s.npz", manifest_for(arrays), arrays), WeightsShapeError, second)


@pytest.mark.parametrize("file_dtype,bad_dtype", [("float32", np.float64), ("float16", np.float32),
                                                  ("float32", np.float16), ("float32", np.int32)])
def test_wrong_dtype(tmp_path, params, file_dtype, bad_dtype):
    arrays = {n: a.astype(file_dtype) for n, a in params.items()}
    name = NAMES[9]
    arrays[name] = params[name].astype(bad_dtype)
    path = write_npz(tmp_path / "t.npz", manifest_for(arrays, dtype=file_dtype), arrays)
    load_error(path, WeightsDtypeError, name)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_inf(tmp_path, params, bad):
    later, first = NAMES[-3], NAMES[6]
    arrays = {n: a.copy() for n, a in params.items()}
    arrays[later].flat[-1] = bad
    arrays[first].flat[1] = bad
    load_error(write_npz(tmp_path / "f.npz", manifest_for(arrays), arrays), WeightsValueError, first)


@pytest.mark.parametrize("how", ["value-changed", "bogus-hash", "no-hash"])
def test_hash_mismatch(tmp_path, params, how):
    manifest = manifest_for(params)
    arrays = {n: a.copy() for n, a in params.items()}
    if how == "value-changed":
        arrays[NAMES[11]].flat[0] = np.nextafter(arrays[NAMES[11]].flat[0], np.float32(np.inf))
    elif how == "bogus-hash":
        manifest["content_hash"] = "sha256:" + "0" * 64
    else:
        del manifest["content_hash"]
    load_error(write_npz(tmp_path / "h.npz", manifest, arrays), WeightsHashError)


def test_hash_covers_names_dtypes_shapes(params):
    h = content_hash(params)
    assert content_hash(dict(reversed(list(params.items())))) == h, "independent of insertion order"
    renamed = dict(params)
    renamed["zz"] = renamed.pop(NAMES[0])
    assert content_hash(renamed) != h, "name"
    assert content_hash({n: a.astype(np.float64) for n, a in params.items()}) != h, "dtype"
    reshaped = dict(params, **{NAMES[0]: params[NAMES[0]].reshape(-1)})
    assert content_hash(reshaped) != h, "shape"


# ---- the writer never leaves a half-written or invalid file ----------------------------------

def _bad_params(params: dict, rng, case: str) -> dict:
    p = {n: a.copy() for n, a in params.items()}
    if case == "missing":
        del p[NAMES[2]]
    elif case == "unexpected":
        p["bogus.weight"] = rng.standard_normal(3).astype(np.float32)
    elif case == "shape":
        p[NAMES[2]] = rng.standard_normal(7).astype(np.float32)
    elif case == "nan":
        p[NAMES[2]].flat[0] = np.nan
    elif case == "fp16-overflow":          # finite in float32, Inf once cast to float16
        p[NAMES[2]].flat[0] = 1e6
    return p


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("case,dtype,cls", [
    ("missing", "float32", WeightsNameError), ("unexpected", "float32", WeightsNameError),
    ("shape", "float32", WeightsShapeError), ("nan", "float32", WeightsValueError),
    ("fp16-overflow", "float16", WeightsValueError), ("valid", "float64", WeightsError),
])
def test_writer_raises_before_writing(tmp_path, params, rng, case, dtype, cls):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    path = out_dir / "w.npz"
    with pytest.raises(cls) as info:
        save_weights(path, TINY, _bad_params(params, rng, case), dtype=dtype)
    assert str(path) in str(info.value), f"error does not name the file: {info.value}"
    assert not path.exists(), "target written despite the error"
    assert list(out_dir.iterdir()) == [], "temporary files left behind"


def test_failed_save_keeps_the_previous_file(tmp_path, params, rng):
    path = tmp_path / "w.npz"
    save_weights(path, TINY, params)
    before = path.read_bytes()
    with pytest.raises(WeightsValueError):
        save_weights(path, TINY, _bad_params(params, rng, "nan"))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]
