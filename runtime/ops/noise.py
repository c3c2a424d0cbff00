"""The spec's noise streams drawn on the GPU (kernels/noise.cu): NumPy's
`Generator(PCG64(seed)).standard_normal(n, dtype=float32)`, bit for bit, one generator per image,
one or more rows of n normals per draw, enqueued on any stream with no host synchronization.

    dn = DeviceNoise(backend, n, module, rows=8, images=B)   # module: any module of the loader
    dn.seed([s0, .. sB-1], stream)             # PCG64(s_i)'s state for image i, uploaded
    dn.draw(out_ptr, stream, image=i)          # image i's next n fp32 normals, NCHW as NumPy fills them
    dn.draw(out_ptr, stream, rows=5, image=i)  # its next 5 rows at once (= 5 draws, one set of launches)
    dn.draw(out_ptr, stream, images=B, stride=S)   # every image's next row in one set of launches, image
                                               # i's at out_ptr + i * S bytes
    dn.draw(x_ptr, stream, nhwc=(C, H * W))    # the same stream scattered to NHWC (the executor's x)
    dn.flags(stream)                           # after the work: 0, or NOISE_* bits (redraw on the host)
    dn.state(stream, image=i)                  # a generator's state as NumPy's state dict
    DeviceNoise(backend, n, module, graphs=True)   # each distinct draw captured once, then graph launches

Flags: FLAG_AMBIGUOUS, a libm-dependent comparison was too close to call (about one draw in 1e9);
FLAG_SHORT, a draw needed more words than it drew (never expected). Either makes every later
draw of that seed wrong too; the caller redraws the whole run on the host. The algorithm, its NumPy
emulation and the NumPy checks: jetson_unet.ops.noise_ref.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from jetson_unet.backends.base import Backend, Module
from jetson_unet.model.arena import regions
from jetson_unet.ops.noise_ref import FLAG_AMBIGUOUS, FLAG_SHORT, WINDOW_LOG2, n_words, numpy_noise_mode

KERNELS = ("noise_words", "noise_walk", "noise_emit")
NOISE_SOURCES = ("host", "device")   # where a sampler draws its noise: NumPy on the CPU, or DeviceNoise
DRAW_NORMALS = 1 << 20   # the most normals a sampler's generator draws at once (~6 bytes of scratch each)
STATE_DTYPE = np.dtype([("s_lo", "<u8"), ("s_hi", "<u8"), ("inc_lo", "<u8"), ("inc_hi", "<u8"),
                        ("has_uint32", "<u4"), ("uinteger", "<u4"), ("flags", "<u4"), ("consumed", "<u4"),
                        ("log1pf_mode", "<i4"), ("window", "<i4"), ("pad", "<u4", (2,))])   # struct NoiseState
__all__ = ["DeviceNoise", "FLAG_AMBIGUOUS", "FLAG_SHORT", "NOISE_SOURCES", "draw_rows", "draw_slots", "pack_states",
           "scratch_sizes", "unpack_state"]


def draw_rows(n: int, timesteps: int, images: int = 1) -> int:
    """Rows of n normals each of a sampler's `images` generators is sized to draw at once (they draw
    together): the sampler's draws double (1, 1, 2, 4, ...), so none is larger than half the rows of
    a run, and all of them together hold at most DRAW_NORMALS normals (or one row each)."""
    return max(1, min((int(timesteps) + 1) // 2, DRAW_NORMALS // (int(n) * int(images))))


def draw_slots(n: int, rows: int, images: int) -> int:
    """How many generators draw in one set of launches (each has a scratch slot): all of them, unless
    their rows of n normals hold more than DRAW_NORMALS together."""
    return max(1, min(int(images), DRAW_NORMALS // (int(n) * int(rows))))


def words_cap(normals: int) -> Tuple[int, int]:
    """(W, the specials' capacity) of a draw of `normals` normals: the words noise_words draws, and
    room for W / 8 specials (1.5% of W expected)."""
    W = n_words(normals)
    return W, max(64, W // 8)


def scratch_sizes(n: int, rows: int, images: int = 1, slots: int = 1) -> dict:
    """The device scratch of `images` generators (a state each) drawing up to `rows` rows of n normals
    per draw, `slots` of them at once (a scratch slot each)."""
    W, cap = words_cap(rows * n)
    return {"state": images * STATE_DTYPE.itemsize, "words": slots * 4 * W, "smask": slots * W // 8,
            "hmask": slots * W // 8, "spre": slots * W // 8, "hpre": slots * W // 8, "rp": slots * 4 * cap,
            "ri": slots * 4 * cap, "rv": slots * 4 * cap}


def pack_states(states: Sequence[dict], mode: int, window: int) -> np.ndarray:
    """NumPy PCG64 state dicts as noise.cu's NoiseStates (flags cleared), filled field by field for
    all of them at once (one array per state took ~2 ms of a batch-64 run's start)."""
    a = np.zeros(len(states), STATE_DTYPE)
    s = [st["state"]["state"] for st in states]
    inc = [st["state"]["inc"] for st in states]
    m = 0xFFFFFFFFFFFFFFFF
    a["s_lo"], a["s_hi"] = [v & m for v in s], [v >> 64 for v in s]
    a["inc_lo"], a["inc_hi"] = [v & m for v in inc], [v >> 64 for v in inc]
    a["has_uint32"] = [int(st["has_uint32"]) for st in states]
    a["uinteger"] = [int(st["uinteger"]) for st in states]
    a["log1pf_mode"], a["window"] = mode, window
    return a


def unpack_state(a: np.ndarray) -> dict:
    r = a.reshape(-1)[0]
    return {"bit_generator": "PCG64",
            "state": {"state": (int(r["s_hi"]) << 64) | int(r["s_lo"]), "inc": (int(r["inc_hi"]) << 64) | int(r["inc_lo"])},
            "has_uint32": int(r["has_uint32"]), "uinteger": int(r["uinteger"])}


class DeviceNoise:
    """`images` generators (one per image: the spec's per-image streams) and `slots` scratch slots for
    rows of n normals: a draw for several images is one set of launches per `slots` of them (default:
    draw_slots). Raises NoiseUnsupported (from noise_ref.numpy_noise_mode) when this NumPy draws
    another stream."""

    window_log2 = WINDOW_LOG2    # test hook: a wide window flags most draws (exercises the host redraw)

    def __init__(self, backend: Backend, n: int, module: Module, rows: int = 1, graphs: bool = False,
                 images: int = 1, slots: Optional[int] = None) -> None:
        self.mode, self.exact = numpy_noise_mode()
        if not 1 <= n * rows < 1 << 30:
            raise ValueError(f"device noise draws hold 1 .. 2^30 normals, got {rows} rows of {n}")
        self.backend, self.n, self.rows, self.images = backend, int(n), int(rows), int(images)
        self.slots = (draw_slots(self.n, self.rows, self.images) if slots is None
                      else max(1, min(int(slots), self.images)))
        self.W, self.cap = words_cap(self.n)         # one row's draw (a test hook: a test may shrink W)
        self.groups = self.W // 32
        W, self._slot_cap = words_cap(self.rows * self.n)   # a slot holds the largest draw
        self._slot_groups = W // 32
        self._fn = {k: module.get(k) for k in KERNELS}
        offs, total = regions(scratch_sizes(self.n, self.rows, self.images, self.slots))
        self._buf = backend.alloc(total)
        self.nbytes = total
        self.ptr = {k: np.uint64(self._buf.ptr + o) for k, o in offs.items()}
        self._up = backend.pinned((self.images * STATE_DTYPE.itemsize,), np.uint8)     # seed() writes it
        self._down = backend.pinned((self.images * STATE_DTYPE.itemsize,), np.uint8)   # flags() / state() read it
        # graphs: a draw's three launches are captured once per (out, layout, rows) and replayed. On
        # an H100, a few plain launches on a second stream leave every later kernel launch of the
        # process ~0.2 us slower; graph launches there do not.
        self._graphs: Optional[dict] = {} if graphs and backend.supports_graphs else None

    def seed(self, seeds: Sequence[int], stream: Any) -> None:
        """Start image i's generator on PCG64(seeds[i])'s stream (the spec's), flags cleared."""
        if len(seeds) != self.images:
            raise ValueError(f"{len(seeds)} seeds for {self.images} generators")
        states = pack_states([np.random.PCG64(s).state for s in seeds], self.mode, self.window_log2)
        self._up[...] = states.view(np.uint8)
        self.backend.h2d(int(self.ptr["state"]), self._up, stream)

    def _sizes(self, rows: int) -> Tuple[int, int, int]:
        """(words W, groups W / 32, specials cap) of a draw of `rows` rows."""
        if rows == 1:
            return self.W, self.groups, self.cap
        W, cap = words_cap(rows * self.n)
        return W, W // 32, cap

    def draw(self, out_ptr: int, stream: Any, nhwc: Optional[Tuple[int, int]] = None, rows: int = 1,
             image: int = 0, images: int = 1, stride: int = 0) -> None:
        """Enqueue the next rows * n normals of each of the generators image .. image + images - 1,
        generator image + j's into out_ptr + j * stride bytes (fp32): NCHW, or NHWC when nhwc =
        (channels, pixels). One draw of k rows is the stream of k draws of one row (the generator's
        buffered half-word carries over either way). A draw's cost is mostly fixed: its rows and its
        images (`slots` at a time) share one set of launches."""
        c, hw = nhwc or (0, 0)
        if not 1 <= rows <= self.rows:
            raise ValueError(f"a draw of {rows} rows from a generator sized for 1 .. {self.rows}")
        if not (images >= 1 and 0 <= image and image + images <= self.images):
            raise ValueError(f"images {image} .. {image + images - 1} of {self.images} generators")
        if images > 1 and (stride % 4 or stride < 4 * rows * self.n):
            raise ValueError(f"images {stride} bytes apart overlap or are not whole floats ({rows} rows of {self.n})")
        if c and self.n % (c * hw):
            raise ValueError(f"{self.n} normals are not whole images of {c} x {hw}")
        if self._graphs is not None:
            key = (int(out_ptr), c, hw, rows, image, images, stride)
            g = self._graphs.get(key)
            if g is None:
                self.backend.capture_begin(stream)
                self._launches(out_ptr, stream, c, hw, rows, image, images, stride)
                g = self._graphs[key] = self.backend.capture_end(stream)
            g.launch(stream)
        else:
            self._launches(out_ptr, stream, c, hw, rows, image, images, stride)

    def _launches(self, out_ptr: int, stream: Any, c: int, hw: int, rows: int, image: int, images: int,
                  stride: int) -> None:
        for j in range(0, images, self.slots):
            self._launch(out_ptr + j * stride, stream, c, hw, rows, image + j, min(self.slots, images - j), stride)

    def _launch(self, out_ptr: int, stream: Any, c: int, hw: int, rows: int, image: int, k: int, stride: int) -> None:
        """Generators image .. image + k - 1 (k <= slots) in one set of launches."""
        W, groups, cap = self._sizes(rows)
        p, G, SG = self.ptr, np.int32(groups), np.int32(self._slot_groups)
        state = np.uint64(int(p["state"]) + image * STATE_DTYPE.itemsize)
        out, layout, ostride = np.uint64(out_ptr), (np.int32(c), np.int32(hw)), np.uint64(stride // 4)
        self._fn["noise_words"].launch((-(-groups // 128), k, 1), (128, 1, 1),
                                       (state, p["words"], p["smask"], p["hmask"], G, SG), 0, stream)
        self._fn["noise_walk"].launch((k, 1, 1), (256, 1, 1),
                                      (state, p["words"], p["smask"], p["hmask"], p["spre"], p["hpre"], p["rp"],
                                       p["ri"], p["rv"], G, np.int32(cap), np.uint32(W), np.uint32(rows * self.n),
                                       out) + layout + (SG, np.int32(self._slot_cap), ostride), 0, stream)
        self._fn["noise_emit"].launch((-(-groups // 8), k, 1), (256, 1, 1),
                                      (p["words"], p["smask"], p["hmask"], p["hpre"], G, np.uint32(rows * self.n),
                                       out) + layout + (SG, ostride), 0, stream)

    def _read(self, stream: Any) -> np.ndarray:
        self.backend.d2h(self._down, int(self.ptr["state"]), stream)
        stream.synchronize()
        return self._down.view(STATE_DTYPE)

    def flags(self, stream: Any) -> int:
        """NOISE_* bits of every generator's draws since seed() (waits for `stream`); 0: every stream
        is NumPy's."""
        return int(np.bitwise_or.reduce(self._read(stream)["flags"]))

    def state(self, stream: Any, image: int = 0) -> dict:
        """Image `image`'s generator's state now, as NumPy's PCG64 state dict (waits for `stream`)."""
        return unpack_state(self._read(stream)[image:image + 1])

    def close(self) -> None:
        self._graphs = {} if self._graphs is not None else None
        if self._buf is not None:
            self._buf.free()
            self._buf = None
