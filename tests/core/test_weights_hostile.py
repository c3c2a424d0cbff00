"""Hostile weights files and configs: each is refused with one typed error before the work starts.

- Paths that are not regular files say what they are; bytes that are not an .npz say so, and never
  pass on numpy's advice to load with allow_pickle.
- Every archive member (each parameter and the manifest) that declares more than the config
  implies, in its .npy header or in the zip directory, or that inflates like a zip bomb, is refused
  from the headers alone: its data is never read (a spy on the reader) and the load allocates a
  few MiB at most (tracemalloc), whatever it declares.
- Every config field out of its bounds is a ConfigError naming the field, its value and the range,
  from the constructor and from `jetson-weights info` (exit 2, one line).
- The manifest's content hash covers everything the file claims, config included.

Archives are written by hand (`write_zip`), so a member can carry any directory entry, header or
compressed payload; the valid baseline is the tiny config's file of test_weights.py.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import socket
import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import List, NamedTuple

import numpy as np
import pytest

from jetson_unet import cli
from jetson_unet.errors import (ConfigError, WeightsError, WeightsFileError, WeightsFormatError,
                                WeightsHashError)
from jetson_unet.model import weights as W
from tests.helpers.weights_load import failed_load
from jetson_unet.model.config import BOUNDS, MAX_PARAMS, Schedule, UNetConfig
from jetson_unet.model.plan import build_plan, param_shapes
from jetson_unet.model.weights import MANIFEST_KEY, file_hash, load_weights, save_weights

TINY = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32)
NAMES = list(param_shapes(TINY))
MEMBERS = [MANIFEST_KEY] + NAMES          # every member of a weights file
MIB = 1 << 20
PEAK_LIMIT = 8 * MIB                      # what loading a refused tiny file may allocate at most
BOMB_BYTES = 200 * 1000 * 1000            # what the bomb member declares (and would inflate to)


# ---- a hand-written zip ------------------------------------------------------------------------

class Member(NamedTuple):
    name: str          # archive name, with ".npy"
    payload: bytes     # as stored (compressed for deflate)
    method: int
    crc: int
    size: int          # the uncompressed size the directory declares
    flags: int = 0     # bit 0: encrypted


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    return buf.getvalue()


def npy_header(shape, descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def stored(name: str, data: bytes, size: int | None = None) -> Member:
    return Member(name + ".npy", data, zipfile.ZIP_STORED, zlib.crc32(data), len(data) if size is None else size)


def write_zip(path: Path, members: List[Member]) -> Path:
    """Local headers, data, central directory, end record: exactly what the members say."""
    out, central = io.BytesIO(), io.BytesIO()
    for m in members:
        name, offset = m.name.encode(), out.tell()
        fields = (20, m.flags, m.method, 0, 0x21, m.crc, len(m.payload), m.size, len(name))
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields, 0) + name + m.payload)
        central.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0, 0, offset) + name)
    cd = central.getvalue()
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(cd), out.tell(), 0)
    path.write_bytes(out.getvalue() + cd + end)
    return path


@functools.lru_cache(maxsize=1)
def _tiny_params() -> dict:
    rng = np.random.Generator(np.random.PCG64(0))
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in param_shapes(TINY).items()}


def tiny_params() -> dict:
    return dict(_tiny_params())


@functools.lru_cache(maxsize=1)
def _tiny_members() -> dict:
    params = tiny_params()
    members = {MANIFEST_KEY: manifest_member(manifest_of(params))}
    members.update({n: stored(n, npy(a)) for n, a in params.items()})
    return members


def manifest_of(params: dict, cfg=TINY, **override) -> dict:
    """A valid manifest (or one with exactly the `override` defect), hashed after the override."""
    cfg_dict = cfg.to_dict() if isinstance(cfg, UNetConfig) else cfg
    m = {"format": "seed-unet-weights", "format_version": 1, "config": cfg_dict, "param_dtype": "float32",
         "n_params": build_plan(cfg if isinstance(cfg, UNetConfig) else TINY).n_params}
    if isinstance(cfg_dict, dict) and isinstance(cfg_dict.get("schedule"), dict):
        m["schedule"] = dict(cfg_dict["schedule"])
    m.update(override)
    m["content_hash"] = file_hash(m, params)
    return m


def manifest_member(manifest: dict) -> Member:
    return stored(MANIFEST_KEY, npy(np.frombuffer(json.dumps(manifest).encode(), np.uint8)))


def tiny_file(path: Path, replace: dict | None = None, manifest: dict | None = None) -> Path:
    """The valid tiny file, with members replaced by name (a Member, or None to leave one out)."""
    members = dict(_tiny_members())
    if manifest is not None:
        members[MANIFEST_KEY] = manifest_member(manifest)
    members.update(replace or {})
    return write_zip(path, [m for m in members.values() if m is not None])


@pytest.fixture(scope="module")
def bomb() -> Member:
    """A deflated member whose .npy header declares 50e6 float32 zeros, 200 MB, ~0.2 MB compressed."""
    header = npy_header((BOMB_BYTES // 4,))
    z, crc, parts = zlib.compressobj(9, zlib.DEFLATED, -15), zlib.crc32(header), []
    parts.append(z.compress(header))
    zeros = bytes(MIB)
    for _ in range(BOMB_BYTES // MIB):
        crc = zlib.crc32(zeros, crc)
        parts.append(z.compress(zeros))
    rest = bytes(BOMB_BYTES % MIB)
    parts += [z.compress(rest), z.flush()]
    crc = zlib.crc32(rest, crc)
    payload = b"".join(parts)
    assert len(payload) < 0.005 * BOMB_BYTES, "the bomb compresses well"
    return Member("", payload, zipfile.ZIP_DEFLATED, crc, len(header) + BOMB_BYTES)


class Refused(NamedTuple):
    error: WeightsError
    peak: int          # bytes tracemalloc saw at the peak of the load
    read: list         # the members whose data was read


def refuse(path: Path, monkeypatch, traced: bool = True) -> Refused:
    """load_weights(path) must raise a WeightsError; what it read, and how much it allocated
    (tracemalloc slows a load 4x: `traced` False skips it, peak 0)."""
    e, read, peak = failed_load(path, monkeypatch, "_read_array", 3, traced)
    assert str(path) in str(e) and "\n" not in str(e), f"one line naming the file: {e}"
    assert "allow_pickle" not in str(e), f"numpy's advice leaked: {e}"
    return Refused(e, peak, read)


# Where the allocation is measured too (every member is checked for what it reads): the manifest,
# the first, a middle and the last parameter.
TRACED = {MANIFEST_KEY, NAMES[0], NAMES[len(NAMES) // 2], NAMES[-1]}


def named(name: str):
    """The tensor an error about member `name` names (None for the manifest: the file itself)."""
    return None if name == MANIFEST_KEY else name


def test_hand_written_zip_loads(tmp_path):
    w = load_weights(tiny_file(tmp_path / "ok.npz"))
    assert list(w.params) == NAMES and all(np.array_equal(w.params[n], a) for n, a in tiny_params().items())


# ---- paths that are not regular files -------------------------------------------------------

def test_directory(tmp_path):
    with pytest.raises(WeightsFileError, match="is a directory, not a regular file"):
        load_weights(tmp_path)


def test_fifo(tmp_path):
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)                      # opening it would block: it must be refused from stat alone
    with pytest.raises(WeightsFileError, match=r"is a FIFO \(named pipe\), not a regular file"):
        load_weights(fifo)


def test_device_file():
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.skip("no /dev/null character device here")
    with pytest.raises(WeightsFileError, match="is a character device, not a regular file"):
        load_weights("/dev/null")


def test_socket(tmp_path):
    path = tmp_path / "s.npz"
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.bind(str(path))
        except OSError:
            pytest.skip("cannot bind a unix socket here")
        with pytest.raises(WeightsFileError, match="is a socket, not a regular file"):
            load_weights(path)


def test_missing_and_broken_link(tmp_path):
    with pytest.raises(WeightsFileError, match="no such file$"):
        load_weights(tmp_path / "absent.npz")
    link = tmp_path / "link.npz"
    link.symlink_to(tmp_path / "absent.npz")
    with pytest.raises(WeightsFileError, match=r"no such file \(a broken symbolic link\)"):
        load_weights(link)


def test_empty_file(tmp_path):
    (tmp_path / "e.npz").write_bytes(b"")
    with pytest.raises(WeightsFileError, match=r"is empty \(0 bytes\)"):
        load_weights(tmp_path / "e.npz")


@pytest.mark.parametrize("args", [["info", "{p}"], ["--weights", "{p}", "--out", "{out}"]], ids=["info", "sample"])
def test_cli_says_what_the_path_is(tmp_path, capsys, args):
    fn = cli.weights_cli if args[0] == "info" else cli.main
    rc = fn([a.format(p=tmp_path, out=tmp_path / "o.png") for a in args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "is a directory" in err and "Traceback" not in err, err


# ---- bytes that are not an .npz ----------------------------------------------------------------

@pytest.mark.parametrize("content", ["random", "pickle", "text", "npy"])
def test_not_an_npz(tmp_path, content):
    rng = np.random.Generator(np.random.PCG64(7))
    data = {"random": rng.bytes(4096),
            "pickle": b"\x80\x04\x95" + rng.bytes(64),   # what np.load would try to unpickle
            "text": b"hello, not weights\n" * 10,
            "npy": npy(np.zeros(7, np.float32))}[content]
    path = tmp_path / "x.npz"
    path.write_bytes(data)
    with pytest.raises(WeightsFileError) as info:
        load_weights(path)
    msg = str(info.value)
    want = "is a single .npy array, not an .npz archive" if content == "npy" else "is not an .npz (zip) file"
    assert want in msg and "allow_pickle" not in msg and "\n" not in msg, msg


def test_cli_random_bytes_one_line_no_pickle_advice(tmp_path, capsys):
    path = tmp_path / "noise.npz"
    path.write_bytes(np.random.Generator(np.random.PCG64(1)).bytes(1000))
    assert cli.weights_cli(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an .npz (zip) file" in err and "allow_pickle" not in err, err


# ---- every member, every way of declaring too much --------------------------------------------

def declaring_too_much(name: str, bomb: Member) -> dict:
    """Ways for member `name` to declare more (or other) than the config implies."""
    good = _tiny_members()[name].payload
    huge = npy_header((10 ** 10,))
    return {
        # a 128-byte member whose .npy header claims 10^10 float32 (40 GB)
        "npy-header-1e10": stored(name, huge + bytes(128 - len(huge))),
        # the zip directory claims 200 MB for a member of the right header and data
        "zip-declares-200MB": stored(name, good, size=BOMB_BYTES),
        # ... or one byte less than the header implies (a small member's stream may then end inside
        # the header read, where zipfile's CRC check fires first)
        "zip-declares-less": stored(name, good, size=len(good) - 1),
        # ~0.2 MB of deflated zeros declaring 200 MB, consistently in the header and the directory
        "deflate-bomb": bomb._replace(name=name + ".npy"),
    }


@pytest.mark.parametrize("name", MEMBERS)
def test_member_declaring_too_much_is_never_read(tmp_path, monkeypatch, bomb, name):
    """Refused from the headers alone, naming the member: its data is never read, and (measured
    where TRACED) the load allocates a few MiB at most."""
    for case, member in declaring_too_much(name, bomb).items():
        traced = name in TRACED and case in ("npy-header-1e10", "deflate-bomb")
        r = refuse(tiny_file(tmp_path / f"{case}.npz", {name: member}), monkeypatch, traced)
        assert type(r.error) is WeightsFileError and r.error.tensor == named(name), (case, r)
        assert name not in r.read and r.peak < PEAK_LIMIT, (case, r)
        if case == "zip-declares-200MB":
            assert "the zip directory declares 200,000," in str(r.error), (case, r)


def test_consistent_bomb_is_refused_by_its_inflation(tmp_path, monkeypatch):
    """Zeros of a valid config, deflated (each header and size right): refused as a bomb, not read."""
    cfg = UNetConfig(image_size=16, dim=64, dim_mults=(1, 2), time_dim=32)
    params = {n: np.zeros(s, np.float32) for n, s in param_shapes(cfg).items()}
    m = manifest_of(params, cfg)
    path = tmp_path / "zeros.npz"
    with open(path, "wb") as f:
        np.savez_compressed(f, **{MANIFEST_KEY: np.frombuffer(json.dumps(m).encode(), np.uint8)}, **params)
    r = refuse(path, monkeypatch)
    assert type(r.error) is WeightsFileError and "zip bomb" in str(r.error), r
    assert r.read == [None], "only the manifest was read"
    assert r.peak < PEAK_LIMIT, r.peak


def test_compressed_real_weights_load(tmp_path):
    """Deflated members are fine when they compress like weights do."""
    params = tiny_params()
    path = tmp_path / "c.npz"
    with open(path, "wb") as f:
        np.savez_compressed(f, **{MANIFEST_KEY: np.frombuffer(json.dumps(manifest_of(params)).encode(), np.uint8)},
                            **params)
    w = load_weights(path)
    assert all(np.array_equal(w.params[n], params[n]) for n in NAMES)


@pytest.mark.parametrize("case", ["duplicate", "not-npy", "encrypted", "bzip2", "bad-magic", "npy-v3", "object"])
def test_odd_members(tmp_path, monkeypatch, case):
    """Members no numpy writer makes: each refused by name or header, never read."""
    params = tiny_params()
    name = NAMES[5]
    good = stored(name, npy(params[name]))
    if case == "duplicate":
        path = write_zip(tmp_path / "d.npz", [manifest_member(manifest_of(params)), good]
                         + [stored(n, npy(a)) for n, a in params.items()])
    else:
        n = params[name].size
        m = {"not-npy": good._replace(name=name + ".txt"),
             "encrypted": good._replace(flags=1),
             "bzip2": good._replace(method=zipfile.ZIP_BZIP2),
             "bad-magic": stored(name, b"\x93NUMPZ" + good.payload[6:]),
             "npy-v3": stored(name, good.payload[:6] + b"\x03\x00" + good.payload[8:]),
             "object": stored(name, npy_header(params[name].shape, "|O") + bytes(8 * n))}[case]
        path = tiny_file(tmp_path / "o.npz", {name: m})
    r = refuse(path, monkeypatch)
    assert name not in r.read and r.error.tensor in (name, name + ".txt"), r


def test_fuzzed_files_raise_only_weights_errors(tmp_path):
    """Byte flips and cuts anywhere in a valid file: it loads (an unused field was hit) or raises a
    WeightsError, never anything else."""
    good = tiny_file(tmp_path / "good.npz").read_bytes()
    rng = np.random.Generator(np.random.PCG64(44))
    path = tmp_path / "f.npz"
    for i in range(100):
        data = bytearray(good)
        if i % 3 == 0:
            data = data[: int(rng.integers(1, len(data)))]
        else:
            for pos in rng.integers(0, len(data), size=int(rng.integers(1, 4))):
                data[pos] = int(rng.integers(0, 256))
        path.write_bytes(bytes(data))
        try:
            load_weights(path)
        except WeightsError as e:
            assert "\n" not in str(e) and "allow_pickle" not in str(e), e


# ---- config bounds -----------------------------------------------------------------------------

# (field, bad value, what the message must say): below, above and of the wrong type, every field.
BAD_CONFIG = [
    ("arch", "other-unet", "arch = 'other-unet' is not supported"),
    ("image_size", 0, "image_size = 0 is out of range"), ("image_size", 4096, "image_size = 4096 is out of range"),
    ("image_size", 15, "image_size = 15 must be a multiple of 2"), ("image_size", "16", "image_size = '16'"),
    ("channels", 0, "channels = 0 is out of range"), ("channels", 17, "channels = 17 is out of range"),
    ("channels", 3.0, "channels = 3.0 is out of range"),
    ("dim", 2, "dim = 2 is out of range"), ("dim", 1024, "dim = 1024 is out of range"),
    ("dim", 9, "dim = 9 must be even"), ("dim", True, "dim = True is out of range"),
    ("dim_mults", [], "len(dim_mults) = 0 is out of range"), ("dim_mults", [1] * 7, "len(dim_mults) = 7"),
    ("dim_mults", [1, 0], "dim_mults[1] = 0 is out of range"), ("dim_mults", [1, 17], "dim_mults[1] = 17"),
    ("dim_mults", [1, 2.0], "dim_mults[1] = 2.0"), ("dim_mults", "12", "dim_mults must be a list"),
    ("convnext_mult", 0, "convnext_mult = 0 is out of range"), ("convnext_mult", 9, "convnext_mult = 9"),
    ("time_dim", 0, "time_dim = 0 is out of range"), ("time_dim", 8192, "time_dim = 8192 is out of range"),
    ("norm_eps", 0, "norm_eps = 0 is out of range"), ("norm_eps", 0.5, "norm_eps = 0.5 is out of range"),
    ("norm_eps", "1e-5", "norm_eps = '1e-5'"),
    ("schedule", "linear", "config.schedule must be a JSON object"),
    ("schedule.kind", "cosine", "schedule.kind = 'cosine' is not supported"),
    ("schedule.timesteps", 1, "schedule.timesteps = 1 is out of range"),
    ("schedule.timesteps", 10 ** 9, "schedule.timesteps = 1000000000 is out of range"),
    ("schedule.timesteps", 100.0, "schedule.timesteps = 100.0 is out of range"),
    ("schedule.beta_start", 0.0, "schedule.beta_start = 0.0 is out of range"),
    ("schedule.beta_start", 0.5, "schedule.beta_start = 0.5 is out of range"),
    ("schedule.beta_start", 0.03, "beta_start < beta_end"),
    ("schedule.beta_end", 1e-6, "schedule.beta_end = 1e-06 is out of range"),
    ("schedule.beta_end", 1.5, "schedule.beta_end = 1.5 is out of range"),
    ("schedule.beta_end", 0.5, "scaled by 1000/T"),
]
FIELDS = ([f.name for f in dataclasses.fields(UNetConfig)]
          + [f"schedule.{f.name}" for f in dataclasses.fields(Schedule)])


def bad_config(field: str, value) -> dict:
    d = TINY.to_dict()
    if field.startswith("schedule."):
        d["schedule"][field.split(".", 1)[1]] = value
    else:
        d[field] = value
    return d


def test_every_config_field_has_a_bad_case_and_a_bound():
    assert sorted({f for f, _, _ in BAD_CONFIG}) == sorted(FIELDS)
    numeric = {"image_size", "channels", "dim", "convnext_mult", "time_dim", "norm_eps", "schedule.timesteps",
               "schedule.beta_start", "schedule.beta_end"}
    assert numeric | {"len(dim_mults)", "dim_mults[i]"} == set(BOUNDS)
    for lo, hi, why in BOUNDS.values():
        assert lo < hi and why


@pytest.mark.parametrize("field,value,says", BAD_CONFIG, ids=[f"{f}={v!r}" for f, v, _ in BAD_CONFIG])
def test_config_field_out_of_bounds(field, value, says):
    with pytest.raises(ConfigError) as info:
        UNetConfig.from_dict(bad_config(field, value))
    msg = str(info.value)
    assert says in msg and "\n" not in msg, msg
    if "out of range" in says:
        lo, hi, _ = BOUNDS["len(dim_mults)" if "len(" in says else "dim_mults[i]" if "dim_mults[" in says
                           else field]
        assert f"[{lo:g}, {hi:g}]" in msg, f"the range is not named: {msg}"


@pytest.mark.parametrize("field,value,says", BAD_CONFIG, ids=[f"{f}={v!r}" for f, v, _ in BAD_CONFIG])
def test_info_refuses_the_config(tmp_path, capsys, field, value, says):
    path = tiny_file(tmp_path / "c.npz", manifest=manifest_of(tiny_params(), cfg=bad_config(field, value)))
    assert cli.weights_cli(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jetson-weights: error: ") and err.count("\n") == 1, err
    assert str(path) in err and "manifest config is invalid" in err and says in err, err


def test_parameter_count_is_bounded(tmp_path, capsys):
    big = dict(UNetConfig().to_dict(), dim=512, time_dim=2048)      # every field in range: 4e9 parameters
    with pytest.raises(ConfigError, match=f"parameters .* exceed {MAX_PARAMS:,}"):
        build_plan(UNetConfig.from_dict(big))
    (tmp_path / "big.json").write_text(json.dumps(big))
    assert cli.weights_cli(["random", str(tmp_path / "big.npz"), "--config", str(tmp_path / "big.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "parameters" in err and not (tmp_path / "big.npz").exists(), err


def test_largest_configs_within_bounds_are_accepted():
    """The bounds stop absurd values only: the spec's model and a wide 1024 px one are fine."""
    UNetConfig()
    cfg = UNetConfig(image_size=1024, channels=16, dim=64, dim_mults=(1, 2, 4, 8, 8, 8), time_dim=256,
                     schedule=Schedule(timesteps=10000, beta_start=1e-6, beta_end=0.05))
    assert build_plan(cfg).n_params <= MAX_PARAMS


# ---- the hash covers what the file claims ------------------------------------------------------

def _tamper_schedule(m: dict) -> None:
    m["config"]["schedule"]["timesteps"] = m["schedule"]["timesteps"] = 50


TAMPER = {   # manifest field -> a change that leaves the tensors valid for the config
    "config.image_size": lambda m: m["config"].update(image_size=32),
    "config.norm_eps": lambda m: m["config"].update(norm_eps=2e-5),
    "config.schedule": _tamper_schedule,
    "extra": lambda m: m.update(extra={"steps": 2}),
}


@pytest.mark.parametrize("field", sorted(TAMPER))
def test_hash_covers_the_claims(tmp_path, field):
    params = tiny_params()
    m = manifest_of(params, extra={"steps": 1})
    TAMPER[field](m)                           # the hash is the untampered one
    with pytest.raises(WeightsHashError):
        load_weights(tiny_file(tmp_path / "t.npz", manifest=m))


@pytest.mark.parametrize("field,value", [("n_params", 7), ("schedule", {"kind": "linear"})])
def test_derived_claims_must_agree(tmp_path, field, value):
    m = manifest_of(tiny_params(), **{field: value})
    with pytest.raises(WeightsFormatError, match=field):
        load_weights(tiny_file(tmp_path / "d.npz", manifest=m))


def test_saved_hash_covers_config_and_dtype(tmp_path):
    params = tiny_params()
    a = save_weights(tmp_path / "a.npz", TINY, params)["content_hash"]
    b = save_weights(tmp_path / "b.npz", dataclasses.replace(TINY, image_size=32), params)["content_hash"]
    c = save_weights(tmp_path / "c.npz", TINY, params, dtype="float16")["content_hash"]
    assert len({a, b, c}) == 3
    assert load_weights(tmp_path / "b.npz").manifest["content_hash"] == b


def test_manifest_size_is_bounded(tmp_path, monkeypatch):
    big = stored(MANIFEST_KEY, npy(np.zeros(W.MAX_MANIFEST_BYTES + 1, np.uint8)))
    r = refuse(tiny_file(tmp_path / "m.npz", {MANIFEST_KEY: big}), monkeypatch)
    assert type(r.error) is WeightsFormatError and r.read == [], r
    deep = b"[" * 100000 + b"]" * 100000                       # nesting past the recursion limit
    r = refuse(tiny_file(tmp_path / "n.npz", {MANIFEST_KEY: stored(MANIFEST_KEY, npy(np.frombuffer(deep, np.uint8)))}),
               monkeypatch)
    assert type(r.error) is WeightsFormatError, r


def test_bounds_are_documented():
    """weights/README.md states every bound as BOUNDS has it."""
    text = (Path(__file__).resolve().parents[2] / "weights" / "README.md").read_text()
    for key, (lo, hi, _) in BOUNDS.items():
        assert f"| {key} | {lo:g} .. {hi:g}" in text, f"weights/README.md does not state {key}'s bounds"
    assert f"{MAX_PARAMS:,}" in text
