"""safetensors weights: the format written by default and shipped, with every hostile class the .npz
reader refuses refused here too, before any tensor data is read.

- The layout: 8-byte little-endian header length, the JSON header (each tensor's dtype, shape and
  data_offsets; `__metadata__` = {"seed-unet": manifest JSON}), then the data, tiled exactly.
- Hostile files, each with one defect: a header length out of bounds, a header that is not a JSON
  object, offsets out of bounds / overlapping / leaving gaps or trailing bytes / not matching the
  shape, a shape bigger than the config, a dtype other than the manifest's, names missing or extra,
  metadata missing or invalid, a truncated file, NaN, a hash mismatch. Refused with the typed error
  naming the file and the first offending tensor; the ones that declare too much read no data
  (a spy on the reader) and allocate a few MiB at most (tracemalloc).
- Round trips: save/load, `jetson-weights convert` both ways (the content hash is kept), `random` by
  extension, `info`; dispatch on content, not the name; the `safetensors` library reads our files
  and we read its (when installed).
"""
from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from jetson_unet import cli
from jetson_unet.errors import (WeightsDtypeError, WeightsError, WeightsFileError, WeightsFormatError,
                                WeightsHashError, WeightsNameError, WeightsShapeError, WeightsValueError)
from jetson_unet.model import weights as W
from tests.helpers.weights_load import failed_load
from jetson_unet.model.config import UNetConfig
from jetson_unet.model.plan import build_plan, param_shapes
from jetson_unet.model.weights import (MAX_HEADER_BYTES, SAFETENSORS_KEY, file_hash, load_weights, save_weights)
from jetson_unet.paths import models_dir

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
NAMES = list(param_shapes(TINY))          # plan order
MIB = 1 << 20
PEAK_LIMIT = 8 * MIB
SHIPPED = models_dir() / "seed-unet-emoji64.safetensors"


@functools.lru_cache(maxsize=1)
def _params() -> dict:
    rng = np.random.Generator(np.random.PCG64(43))
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in param_shapes(TINY).items()}


def params() -> dict:
    return {n: a.copy() for n, a in _params().items()}


def manifest_of(arrays: dict, dtype: str = "float32", **override) -> dict:
    m = {"format": "seed-unet-weights", "format_version": 1, "config": TINY.to_dict(),
         "schedule": TINY.to_dict()["schedule"], "param_dtype": dtype, "n_params": build_plan(TINY).n_params}
    m.update(override)
    m.setdefault("content_hash", file_hash(m, arrays))
    return m


def layout(arrays: dict, codes: dict | None = None) -> tuple:
    """(entries, data): each array's header entry, its data contiguous in the given order."""
    entries, chunks, pos = {}, [], 0
    for name, a in arrays.items():
        raw = np.ascontiguousarray(a).tobytes()
        code = (codes or {}).get(name) or {"float32": "F32", "float16": "F16", "float64": "F64"}[a.dtype.name]
        entries[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    return entries, b"".join(chunks)


def st_bytes(header, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: the header (a dict, or raw bytes) behind its length (or `length`)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def st_file(path: Path, arrays: dict | None = None, manifest=..., meta=..., edit=None, data=None) -> Path:
    """The valid tiny file, or one with exactly the given defect: other arrays, manifest or metadata,
    `edit(entries)` changing the header entries, or other data bytes."""
    arrays = params() if arrays is None else arrays
    entries, raw = layout(arrays)
    if manifest is ...:
        manifest = manifest_of(arrays)
    if meta is ...:
        meta = {SAFETENSORS_KEY: json.dumps(manifest)}
    header = {} if meta is None else {"__metadata__": meta}
    header.update(entries)
    if edit is not None:
        edit(header)
    path.write_bytes(st_bytes(header, raw if data is None else data))
    return path


def refuse(path: Path, monkeypatch, cls: type, tensor=None, traced: bool = False) -> tuple:
    """load_weights(path) raises exactly `cls` naming the file (and `tensor`); returns (error, the
    tensors whose data was read, the peak allocation when traced)."""
    e, read, peak = failed_load(path, monkeypatch, "_read_tensor", 2, traced)
    assert type(e) is cls, f"{type(e).__name__} raised, {cls.__name__} expected: {e}"
    assert e.path == str(path) and str(path) in str(e) and "\n" not in str(e), e
    assert e.tensor == tensor, f"names tensor {e.tensor!r}, expected {tensor!r}: {e}"
    return e, read, peak


# ---- round trips ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_round_trip_and_layout(tmp_path, dtype):
    path = tmp_path / "w.safetensors"
    manifest = save_weights(path, TINY, params(), dtype=dtype, extra={"notes": "h\u00e9llo \"quoted\""})
    w = load_weights(path)
    assert w.file_format == "safetensors" and w.manifest == manifest and list(w.params) == NAMES
    for n, a in params().items():
        assert w.params[n].dtype == np.dtype(dtype) and np.array_equal(w.params[n], a.astype(dtype)), n
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    assert n % 8 == 0 and data[8:9] == b"{", "the header is padded so the data section is 8-byte aligned"
    header = json.loads(data[8:8 + n])
    assert list(header) == ["__metadata__"] + NAMES, "the manifest first, then the tensors in plan order"
    assert header["__metadata__"] == {SAFETENSORS_KEY: json.dumps(manifest, sort_keys=True)}
    assert header[NAMES[0]]["dtype"] == {"float32": "F32", "float16": "F16"}[dtype]
    assert header[NAMES[-1]]["data_offsets"][1] == len(data) - 8 - n


def test_hand_built_file_loads(tmp_path):
    """The helpers build a valid file, so each case below has exactly one defect."""
    w = load_weights(st_file(tmp_path / "ok.safetensors"))
    assert all(np.array_equal(w.params[n], a) for n, a in params().items())


def test_the_data_may_come_in_any_order(tmp_path):
    """Offsets, not the header's order, place the data (the safetensors library sorts its own way)."""
    p = params()
    arrays = dict(reversed(list(p.items())))
    w = load_weights(st_file(tmp_path / "r.safetensors", arrays, manifest_of(p)))
    assert list(w.params) == NAMES and all(np.array_equal(w.params[n], p[n]) for n in NAMES)


def test_dispatch_is_on_content_not_the_name(tmp_path):
    st = tmp_path / "really-safetensors.npz"
    save_weights(tmp_path / "a.safetensors", TINY, params())
    st.write_bytes((tmp_path / "a.safetensors").read_bytes())
    npz = tmp_path / "really-npz.safetensors"
    save_weights(tmp_path / "b.npz", TINY, params())
    npz.write_bytes((tmp_path / "b.npz").read_bytes())
    assert load_weights(st).file_format == "safetensors" and load_weights(npz).file_format == "npz"


def test_save_refuses_an_unknown_extension(tmp_path):
    with pytest.raises(WeightsError, match=r"must end in \.safetensors or \.npz"):
        save_weights(tmp_path / "w.bin", TINY, params())
    assert list(tmp_path.iterdir()) == []


# ---- the CLI: convert both ways, random by extension, info ------------------------------------------

def test_cli_convert_both_ways_keeps_the_manifest_and_hash(tmp_path, capsys):
    src = tmp_path / "a.npz"
    manifest = save_weights(src, TINY, params(), dtype="float16", extra={"steps": 3})
    st, back = tmp_path / "sub" / "b.safetensors", tmp_path / "c.npz"
    assert cli.weights_cli(["convert", str(src), str(st)]) == 0
    assert cli.weights_cli(["convert", str(st), str(back)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {st} (safetensors, from npz {src}, {manifest['content_hash']})" in out, out
    a, b, c = load_weights(src), load_weights(st), load_weights(back)
    assert (b.file_format, c.file_format) == ("safetensors", "npz")
    assert a.manifest == b.manifest == c.manifest == manifest, "the content hash is format-independent"
    assert all(np.array_equal(a.params[n], b.params[n]) and np.array_equal(a.params[n], c.params[n]) for n in NAMES)
    st2 = tmp_path / "d.safetensors"
    assert cli.weights_cli(["convert", str(back), str(st2)]) == 0
    assert st2.read_bytes() == st.read_bytes(), "conversion is deterministic"


def test_cli_random_writes_by_extension_and_info_names_the_format(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(TINY.to_json())
    for name in ("r.safetensors", "r.npz"):
        assert cli.weights_cli(["random", str(tmp_path / name), "--config", str(cfg)]) == 0
    assert (tmp_path / "r.safetensors").read_bytes()[8:9] == b"{" and (tmp_path / "r.npz").read_bytes()[:2] == b"PK"
    capsys.readouterr()
    for name, fmt in (("r.safetensors", "safetensors"), ("r.npz", "npz")):
        assert cli.weights_cli(["info", str(tmp_path / name)]) == 0
        assert capsys.readouterr().out.startswith(f"{tmp_path / name}: ok, {fmt}, ")


@pytest.mark.parametrize("cmd", ["random", "convert"])
def test_cli_refuses_an_unknown_output_extension_before_any_work(tmp_path, capsys, monkeypatch, cmd):
    def work(*a, **kw):
        raise AssertionError("work started")
    monkeypatch.setattr(W, "load_weights", work)
    monkeypatch.setattr(W, "save_weights", work)
    argv = ["random", str(tmp_path / "w.bin")] if cmd == "random" else ["convert", "x.npz", str(tmp_path / "w.bin")]
    assert cli.weights_cli(argv) == 2
    err = capsys.readouterr().err
    flag = "OUT" if cmd == "random" else "DST"
    assert err == f"jetson-weights: error: {flag} {tmp_path / 'w.bin'} must end in .safetensors or .npz " \
                  "(the format it is written in)\n", err
    assert list(tmp_path.iterdir()) == []


def test_cli_convert_of_a_bad_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(st_bytes(b"{}", length=1 << 40))
    assert cli.weights_cli(["convert", str(bad), str(tmp_path / "out.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "header length" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


# ---- the header: its length, its JSON -----------------------------------------------------------

@pytest.mark.parametrize("length", [2 ** 64 - 1, MAX_HEADER_BYTES + 1, 1 << 40], ids=["u64-max", "limit+1", "1TiB"])
def test_header_length_out_of_bounds_is_refused_before_reading(tmp_path, monkeypatch, length):
    path = tmp_path / "h.safetensors"
    path.write_bytes(st_bytes(b'{"a": 1}' + bytes(100), length=length))
    e, read, peak = refuse(path, monkeypatch, WeightsFileError, traced=True)
    assert "header length" in str(e) and read == [] and peak < PEAK_LIMIT, (e, peak)


def test_header_longer_than_the_file(tmp_path, monkeypatch):
    good = st_file(tmp_path / "g.safetensors").read_bytes()
    path = tmp_path / "h.safetensors"
    path.write_bytes(good[:8] + good[8:100])
    e, read, _ = refuse(path, monkeypatch, WeightsFileError)
    assert "truncated" in str(e) and read == [], e


@pytest.mark.parametrize("raw,says", [
    (b"[1, 2, 3]", "not a JSON object"), (b"  {}", "not a JSON object"), (b'{"a": ', "not valid JSON"),
    (b'{"a": "\xff\xfe"}', "not valid JSON"), (b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", "not valid JSON"),
    (b'{"x": 1, "x": 2}', "twice"), (b'{"a": NaN}', "not valid JSON"),
], ids=["list", "leading-space", "cut", "not-utf8", "deep", "duplicate-key", "bad-token"])
def test_header_that_is_not_a_json_object(tmp_path, monkeypatch, raw, says):
    path = tmp_path / "j.safetensors"
    path.write_bytes(st_bytes(raw, b"\0" * 64))
    e, read, _ = refuse(path, monkeypatch, WeightsFileError, tensor="x" if says == "twice" else None)
    assert says in str(e) and read == [], e


def test_duplicate_tensor_is_named(tmp_path, monkeypatch):
    entries, data = layout(params())
    meta = json.dumps({SAFETENSORS_KEY: json.dumps(manifest_of(params()))})
    items = [f'"{n}": {json.dumps(v)}' for n, v in entries.items()]
    items.append(f'"{NAMES[4]}": {json.dumps(entries[NAMES[4]])}')
    path = tmp_path / "d.safetensors"
    path.write_bytes(st_bytes(("{" + f'"__metadata__": {meta}, ' + ", ".join(items) + "}").encode(), data))
    refuse(path, monkeypatch, WeightsFileError, NAMES[4])


# ---- __metadata__ and the manifest in it -------------------------------------------------------------

@pytest.mark.parametrize("case,says", [
    ("missing", "no __metadata__"), ("not-a-map", "must map strings to strings"),
    ("not-strings", "must map strings to strings"), ("no-key", f"no {SAFETENSORS_KEY!r} key"),
    ("extra-key", "unexpected safetensors __metadata__ key 'format'"), ("not-json", "not valid JSON"),
    ("too-big", "at most 1,048,576 bytes"), ("other-format", "format is not"), ("version-2", "format version 2"),
    ("bad-config", "config is invalid"), ("n-params", "n_params"),
])
def test_metadata_missing_or_invalid(tmp_path, monkeypatch, case, says):
    m = json.dumps(manifest_of(params()))
    meta = {"missing": None, "not-a-map": ["x"], "not-strings": {SAFETENSORS_KEY: {"format": "seed-unet-weights"}},
            "no-key": {"format": "pt"}, "extra-key": {SAFETENSORS_KEY: m, "format": "pt"},
            "not-json": {SAFETENSORS_KEY: "{not json"}, "too-big": {SAFETENSORS_KEY: " " * (MIB + 1)},
            "other-format": {SAFETENSORS_KEY: json.dumps(manifest_of(params(), format="x"))},
            "version-2": {SAFETENSORS_KEY: json.dumps(manifest_of(params(), format_version=2))},
            "bad-config": {SAFETENSORS_KEY: json.dumps(manifest_of(params(), config={"dim": 10 ** 9}))},
            "n-params": {SAFETENSORS_KEY: json.dumps(manifest_of(params(), n_params=7))}}[case]
    e, read, _ = refuse(st_file(tmp_path / "m.safetensors", meta=meta), monkeypatch, WeightsFormatError)
    assert says in str(e) and read == [], e


# ---- names, shapes, dtypes --------------------------------------------------------------------------

def test_missing_and_extra_names(tmp_path, monkeypatch):
    p = params()
    del p[NAMES[3]]
    refuse(st_file(tmp_path / "a.safetensors", p, manifest_of(params())), monkeypatch, WeightsNameError, NAMES[3])
    p = dict(params(), **{"extra.weight": np.zeros(3, np.float32)})
    refuse(st_file(tmp_path / "b.safetensors", p, manifest_of(params())), monkeypatch, WeightsNameError, "extra.weight")


@pytest.mark.parametrize("name", [NAMES[0], NAMES[len(NAMES) // 2], NAMES[-1]])
def test_shape_bigger_than_the_config_is_never_read(tmp_path, monkeypatch, name):
    """A tensor declaring 10^10 elements (offsets to match): refused from the header alone."""
    def edit(h):
        h[name]["shape"] = [10 ** 10]
        h[name]["data_offsets"][1] = h[name]["data_offsets"][0] + 4 * 10 ** 10
    e, read, peak = refuse(st_file(tmp_path / "s.safetensors", edit=edit), monkeypatch, WeightsShapeError, name,
                           traced=True)
    assert read == [] and peak < PEAK_LIMIT, (e, peak)


def test_shape_of_another_parameter(tmp_path, monkeypatch):
    p = params()
    p[NAMES[2]] = np.zeros(7, np.float32)
    refuse(st_file(tmp_path / "s.safetensors", p, manifest_of(params())), monkeypatch, WeightsShapeError, NAMES[2])


@pytest.mark.parametrize("code", ["F64", "BF16", "I8", "f32", 7, None])
def test_dtype_other_than_f16_f32(tmp_path, monkeypatch, code):
    def edit(h):
        h[NAMES[1]]["dtype"] = code
    e, read, _ = refuse(st_file(tmp_path / "t.safetensors", edit=edit), monkeypatch, WeightsDtypeError, NAMES[1])
    assert "is not one this runtime reads (F16, F32)" in str(e) and read == [], e


def test_dtype_other_than_the_manifests(tmp_path, monkeypatch):
    """F16 data (consistent offsets) in a float32 file."""
    p = params()
    p[NAMES[1]] = p[NAMES[1]].astype(np.float16)
    e, read, _ = refuse(st_file(tmp_path / "t.safetensors", p, manifest_of(params())), monkeypatch,
                        WeightsDtypeError, NAMES[1])
    assert "differs from the manifest's float32" in str(e) and read == [], e


# ---- data offsets: in bounds, matching the shape, tiling the data section ------------------------------

def _shift(name: str, begin: int = 0, end: int = 0):
    def edit(h):
        h[name]["data_offsets"] = [h[name]["data_offsets"][0] + begin, h[name]["data_offsets"][1] + end]
    return edit


def _entry(name: str, key: str, value):
    def edit(h):
        if key == "":
            h[name] = value
        elif value is ...:
            del h[name][key]
        else:
            h[name][key] = value
    return edit


OFFSETS = {   # case: (edit, the tensor named, what the message says)
    "past-the-end": (_shift(NAMES[-1], 4, 4), NAMES[-1], "run past the data section"),
    "huge-end": (_entry(NAMES[0], "data_offsets", [0, 10 ** 12]), NAMES[0], "run past the data section"),
    "span-too-short": (_shift(NAMES[3], 0, -4), NAMES[3], "imply"),
    "overlap": (_shift(NAMES[3], -4, -4), NAMES[3], "overlaps tensor"),
    "gap": (_shift(NAMES[-1], 4, 4), NAMES[-1], None),   # with 4 more data bytes: a gap before the last
    "reversed": (_entry(NAMES[2], "data_offsets", [8, 4]), NAMES[2], "0 <= begin <= end"),
    "negative": (_entry(NAMES[2], "data_offsets", [-4, 0]), NAMES[2], "0 <= begin <= end"),
    "floats": (_entry(NAMES[2], "data_offsets", [0.0, 4.0]), NAMES[2], "0 <= begin <= end"),
    "bools": (_entry(NAMES[2], "data_offsets", [False, True]), NAMES[2], "0 <= begin <= end"),
    "three": (_entry(NAMES[2], "data_offsets", [0, 4, 8]), NAMES[2], "0 <= begin <= end"),
    "no-offsets": (_entry(NAMES[2], "data_offsets", ...), NAMES[2], "object of dtype, shape and data_offsets"),
    "extra-field": (_entry(NAMES[2], "offset", 0), NAMES[2], "object of dtype, shape and data_offsets"),
    "entry-a-list": (_entry(NAMES[2], "", [1, 2]), NAMES[2], "object of dtype, shape and data_offsets"),
    "shape-strings": (_entry(NAMES[2], "shape", ["8"]), NAMES[2], "not a list of non-negative integers"),
    "shape-negative": (_entry(NAMES[2], "shape", [-1]), NAMES[2], "not a list of non-negative integers"),
    "shape-scalar": (_entry(NAMES[2], "shape", 8), NAMES[2], "not a list of non-negative integers"),
}


@pytest.mark.parametrize("case", list(OFFSETS))
def test_offsets_and_entries(tmp_path, monkeypatch, case):
    edit, tensor, says = OFFSETS[case]
    data = layout(params())[1] + (bytes(4) if case == "gap" else b"")
    e, read, _ = refuse(st_file(tmp_path / "o.safetensors", edit=edit, data=data), monkeypatch, WeightsFileError,
                        tensor)
    assert (says or "belong to no tensor") in str(e) and read == [], e


def test_trailing_bytes_after_the_last_tensor(tmp_path, monkeypatch):
    data = layout(params())[1] + bytes(8)
    e, read, _ = refuse(st_file(tmp_path / "t.safetensors", data=data), monkeypatch, WeightsFileError)
    assert "8 bytes after the last tensor's data belong to no tensor" in str(e) and read == [], e


def test_truncated_file(tmp_path, monkeypatch):
    good = st_file(tmp_path / "g.safetensors").read_bytes()
    path = tmp_path / "t.safetensors"
    for cut in (9, 50, len(good) // 2, len(good) - 1):
        path.write_bytes(good[:cut])
        with pytest.raises(WeightsFileError, match="truncated|run past"):
            load_weights(path)


# ---- values and the hash -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_values(tmp_path, monkeypatch, value):
    p = params()
    p[NAMES[5]].flat[3] = value
    refuse(st_file(tmp_path / "v.safetensors", p, manifest_of(p)), monkeypatch, WeightsValueError, NAMES[5])


def test_hash_mismatch(tmp_path, monkeypatch):
    p = params()
    q = dict(p, **{NAMES[5]: p[NAMES[5]] + 1})
    refuse(st_file(tmp_path / "h.safetensors", q, manifest_of(p)), monkeypatch, WeightsHashError)
    m = manifest_of(p, extra={"steps": 1})
    m["extra"]["steps"] = 2                                     # the claims edited, the hash not
    refuse(st_file(tmp_path / "c.safetensors", p, m), monkeypatch, WeightsHashError)


def test_paths_that_are_not_regular_files(tmp_path):
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(WeightsFileError, match="is a directory"):
        load_weights(tmp_path / "d.safetensors")
    (tmp_path / "e.safetensors").write_bytes(b"")
    with pytest.raises(WeightsFileError, match=r"is empty \(0 bytes\)"):
        load_weights(tmp_path / "e.safetensors")
    (tmp_path / "s.safetensors").write_bytes(b"{}")
    with pytest.raises(WeightsFileError, match="too short"):
        load_weights(tmp_path / "s.safetensors")


def test_fuzzed_files_raise_only_weights_errors(tmp_path):
    """Byte flips and cuts anywhere (header included): it loads or raises a WeightsError, nothing else."""
    good = st_file(tmp_path / "good.safetensors").read_bytes()
    n = struct.unpack("<Q", good[:8])[0]
    rng = np.random.Generator(np.random.PCG64(45))
    path = tmp_path / "f.safetensors"
    for i in range(150):
        data = bytearray(good)
        if i % 3 == 0:
            data = data[: int(rng.integers(1, len(data)))]
        else:   # two in three flips land in the header, where they matter most
            hi = 8 + n if i % 3 == 1 else len(data)
            for pos in rng.integers(0, hi, size=int(rng.integers(1, 4))):
                data[pos] = int(rng.integers(0, 256))
        path.write_bytes(bytes(data))
        try:
            load_weights(path)
        except WeightsError as e:
            assert "\n" not in str(e), e


# ---- the safetensors library --------------------------------------------------------------------------

def test_the_safetensors_library_reads_our_files(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    safetensors = pytest.importorskip("safetensors")
    for dtype in ("float32", "float16"):
        path = tmp_path / f"{dtype}.safetensors"
        manifest = save_weights(path, TINY, params(), dtype=dtype)
        ours = load_weights(path).params
        theirs = st_numpy.load_file(str(path))
        assert sorted(theirs) == sorted(ours)
        for n in ours:
            assert theirs[n].dtype == ours[n].dtype and np.array_equal(theirs[n], ours[n]), n
        with safetensors.safe_open(str(path), "np") as f:
            assert json.loads(f.metadata()[SAFETENSORS_KEY]) == manifest


def test_we_read_the_safetensors_librarys_files(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    p = {n: a.astype(np.float16) for n, a in params().items()}
    path = tmp_path / "lib.safetensors"
    st_numpy.save_file(p, str(path), metadata={SAFETENSORS_KEY: json.dumps(manifest_of(p, "float16"))})
    w = load_weights(path)
    assert all(np.array_equal(w.params[n], p[n]) for n in NAMES)


@pytest.mark.skipif(not SHIPPED.is_file(), reason="no shipped model")
def test_the_shipped_model_is_safetensors_the_library_reads():
    w = load_weights(SHIPPED)
    assert w.file_format == "safetensors" and w.manifest["content_hash"] == file_hash(w.manifest, w.params)
    st_numpy = pytest.importorskip("safetensors.numpy")
    theirs = st_numpy.load_file(str(SHIPPED))
    assert sorted(theirs) == sorted(w.params) and all(np.array_equal(theirs[n], w.params[n]) for n in w.params)
