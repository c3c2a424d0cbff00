"""kernels/noise.cu run on the CPU by tests/emu/simt.h (g++, one std::thread per CUDA thread) under the
real host driver, jetson_unet.ops.noise.DeviceNoise, through a backend whose memory is host memory and
whose kernels are the emulated ones: the draws must equal NumPy's standard_normal(float32) bit for
bit, the state after them NumPy's, in both output layouts, one generator per image (the spec's
per-image streams) sharing one scratch; the ambiguity hook and a draw that runs
out of words must raise the flags. The kernel's log1pf is checked against this libm's log1pf on all
2^24 inputs the tail can take. Last, GpuSampler's device noise end to end over the same emulated
kernels (the U-Net's launches are no-ops). No GPU needed; skipped without g++."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from jetson_unet.paths import kernels_dir
from jetson_unet.ops import noise_ref
from jetson_unet.ops.noise import FLAG_AMBIGUOUS, FLAG_SHORT, DeviceNoise
from tests.emulated.test_conv_pipe_emulated import compile_emu

pytestmark = pytest.mark.slow
EMU = Path(__file__).parent / "emu"

# the kernels' parameter lists, as noise.cu declares them
PARAMS = {
    "noise_words": "const NoiseState *a0, unsigned *a1, unsigned *a2, unsigned *a3, int a4, int a5",
    "noise_walk": "NoiseState *a0, const unsigned *a1, const unsigned *a2, unsigned *a3, unsigned *a4, unsigned *a5, "
                  "unsigned *a6, unsigned *a7, unsigned *a8, int a9, int a10, unsigned a11, unsigned a12, float *a13, "
                  "int a14, int a15, int a16, int a17, unsigned long long a18",
    "noise_emit": "const unsigned *a0, const unsigned *a1, const unsigned *a2, const unsigned *a3, int a4, unsigned a5, "
                  "float *a6, int a7, int a8, int a9, unsigned long long a10",
}
EXTRA = r"""
extern "C" void emu_log1pf(const float *x, float *out, unsigned char *amb, long count, int mode, int window) {
    for (long i = 0; i < count; ++i) { bool a = false; out[i] = numpy_log1pf(x[i], mode, window, a); amb[i] = a; }
}
extern "C" long libm_mismatches(void) {   // kernel port vs this libm's log1pf over every -k 2^-24
    long bad = 0;
    for (unsigned k = 0; k < (1u << 24); ++k) {
        const float x = -next_float(k << 8);
        bad += __float_as_int(log1pf_fdlibm(x)) != __float_as_int(log1pf(x));
    }
    return bad;
}
"""


def emu_source() -> str:
    parts = [f'#include "{EMU / "simt.h"}"', f'#include "{EMU / "simt_noise.h"}"', (kernels_dir() / "noise.cu").read_text()]
    for name, params in PARAMS.items():
        args = ", ".join(f"a{i}" for i in range(params.count(",") + 1))
        parts.append(f'extern "C" void emu_{name}(int gx, int gy, int gz, int nt, {params}) '
                     f'{{ emu_launch([&] {{ {name}({args}); }}, gx, gy, gz, nt); }}')
    return "\n".join(parts) + EXTRA


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return compile_emu(emu_source(), tmp_path_factory.mktemp("noise_emu"), opts=("-O2", "-ffp-contract=off"))


class HostBuffer:
    def __init__(self, nbytes: int) -> None:
        self.mem = np.zeros(max(nbytes, 1), np.uint8)
        self.ptr = self.mem.ctypes.data

    def free(self) -> None:
        self.ptr = 0


class EmuFunction:
    CTYPES = {np.uint64: ctypes.c_void_p, np.int32: ctypes.c_int, np.uint32: ctypes.c_uint}

    def __init__(self, lib, symbol: str) -> None:
        self.fn, self.symbol = getattr(lib, "emu_" + symbol), symbol

    def launch(self, grid, block, args, shared_mem=0, stream=None) -> None:
        assert grid[2] == 1 and block[1:] == (1, 1) and shared_mem == 0
        cargs = [self.CTYPES[type(a)](int(a)) for a in args]
        self.fn(ctypes.c_int(grid[0]), ctypes.c_int(grid[1]), ctypes.c_int(1), ctypes.c_int(block[0]), *cargs)


class EmuModule:
    def __init__(self, lib) -> None:
        self.lib = lib

    def get(self, symbol: str) -> EmuFunction:
        return EmuFunction(self.lib, symbol)


class Stream:
    def synchronize(self) -> None:
        pass


class EmuBackend:
    """Device memory is host memory; copies are memmoves; launches run the emulated kernels."""

    def alloc(self, nbytes: int) -> HostBuffer:
        return HostBuffer(nbytes)

    def pinned(self, shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype)

    def trim_pinned(self) -> None:
        pass

    def h2d(self, dst: int, host: np.ndarray, stream) -> None:
        ctypes.memmove(dst, host.ctypes.data, host.nbytes)

    def d2h(self, host: np.ndarray, src: int, stream) -> None:
        ctypes.memmove(host.ctypes.data, src, host.nbytes)


def out_buffer(n: int) -> np.ndarray:
    return np.full(n, np.nan, np.float32)      # poisoned: every element must be written


def bits_equal(got: np.ndarray, want: np.ndarray, label: str) -> None:
    diff = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    assert diff.size == 0, f"{label}: {diff.size} of {want.size} normals differ, first at {diff[:4].tolist()}: " \
                           f"got {got[diff[:4]]}, want {want[diff[:4]]}"


@pytest.fixture
def noise(lib):
    made = []

    def make(n: int, rows: int = 1, images: int = 1, slots=None) -> DeviceNoise:
        dn = DeviceNoise(EmuBackend(), n, EmuModule(lib), rows=rows, images=images, slots=slots)
        made.append(dn)
        return dn
    yield make
    for dn in made:
        dn.close()


@pytest.mark.parametrize("n,seeds", [(1, range(6)), (37, range(4)), (12288, [0, 7])], ids=["1", "37", "12288"])
def test_draws_equal_numpy_and_leave_its_state(noise, n, seeds):
    dn, s = noise(n), Stream()
    for seed in seeds:
        dn.seed([seed], s)
        rng = np.random.Generator(np.random.PCG64(seed))
        for k in range(3):                         # consecutive rows carry NumPy's buffered half-word
            out = out_buffer(n)
            dn.draw(out.ctypes.data, s)
            bits_equal(out, rng.standard_normal(n, dtype=np.float32), f"seed {seed} n {n} row {k}")
            assert dn.state(s) == rng.bit_generator.state, f"seed {seed} n {n} row {k}: state"
        assert dn.flags(s) == 0


@pytest.mark.parametrize("n", [37, 12288])
def test_a_draw_of_several_rows_is_the_stream_of_single_rows(noise, n):
    """The sampler draws its rows in chunks: k rows at once must be NumPy's stream, as k draws of one
    row are, with the buffered half-word carried into and out of the chunk."""
    dn, s = noise(n, rows=5), Stream()
    for seed in ((0, 5) if n < 1000 else (5,)):   # the image-sized rows: one seed (each ~8 s emulated)
        dn.seed([seed], s)
        rng = np.random.Generator(np.random.PCG64(seed))
        for k in (1, 5, 2, 3):
            out = out_buffer(k * n)
            dn.draw(out.ctypes.data, s, rows=k)
            bits_equal(out, rng.standard_normal(k * n, dtype=np.float32), f"seed {seed} n {n} rows {k}")
            assert dn.state(s) == rng.bit_generator.state, f"seed {seed} n {n} rows {k}: state"
        assert dn.flags(s) == 0
    with pytest.raises(ValueError, match="a draw of 6 rows from a generator sized for 1 .. 5"):
        dn.draw(out.ctypes.data, s, rows=6)


def test_nhwc_layout_is_the_nchw_stream_transposed(noise):
    b, c, hw = 2, 3, 25
    dn, s = noise(b * c * hw), Stream()
    dn.seed([3], s)
    out = out_buffer(b * c * hw)
    dn.draw(out.ctypes.data, s, nhwc=(c, hw))
    want = np.random.Generator(np.random.PCG64(3)).standard_normal((b, c, hw), dtype=np.float32)
    bits_equal(out, np.ascontiguousarray(want.transpose(0, 2, 1)).reshape(-1), "nhwc")


@pytest.mark.parametrize("n", [37, 768])
def test_one_generator_per_image(noise, n):
    """images=3: image i's draws are PCG64(seeds[i])'s stream whatever the others draw in between
    (the generators share one scratch), its state is its own, and a reseed starts every one again."""
    dn, s = noise(n, rows=3, images=3), Stream()
    for seeds in ([9, 5, 2 ** 63 - 1], [5, 5, 0]):
        dn.seed(seeds, s)
        rngs = [np.random.Generator(np.random.PCG64(k)) for k in seeds]
        for image, rows in ((0, 1), (2, 3), (1, 1), (0, 2), (1, 3), (2, 1), (1, 1)):
            out = out_buffer(rows * n)
            dn.draw(out.ctypes.data, s, rows=rows, image=image)
            bits_equal(out, rngs[image].standard_normal(rows * n, dtype=np.float32),
                       f"seeds {seeds} image {image} rows {rows}")
        for i, g in enumerate(rngs):
            assert dn.state(s, image=i) == g.bit_generator.state, f"seeds {seeds} image {i}: state"
        assert dn.flags(s) == 0
    with pytest.raises(ValueError):
        dn.seed([1, 2], s)
    with pytest.raises(ValueError):
        dn.draw(out.ctypes.data, s, image=3)


@pytest.mark.parametrize("slots", [3, 2])
def test_per_image_nhwc_x_t_into_its_part_of_the_batch(noise, slots):
    """The sampler's x_T: image i drawn by its own generator, NHWC, into x + i * C*H*W, every image in
    one draw (slots 2: two sets of launches for the three)."""
    b, c, hw = 3, 3, 25
    dn, s = noise(c * hw, images=b, slots=slots), Stream()
    dn.seed([4, 8, 1], s)
    out = out_buffer(b * c * hw)
    dn.draw(out.ctypes.data, s, nhwc=(c, hw), images=b, stride=4 * c * hw)
    want = np.stack([np.random.Generator(np.random.PCG64(k)).standard_normal((c, hw), dtype=np.float32)
                     for k in (4, 8, 1)])
    bits_equal(out, np.ascontiguousarray(want.transpose(0, 2, 1)).reshape(-1), "per-image nhwc")


@pytest.mark.parametrize("slots", [4, 3])
def test_a_draw_for_several_images_is_each_images_stream(noise, slots):
    """The sampler's rows: images 1 .. 3 of 4 in one draw of k rows each, image j's into its own rows
    (a gap between them left as it was); image 0 drawn alone in between; every generator's stream
    and state its own (slots 3 of 4: all three in one set of launches; then in two)."""
    n, T, seeds = 37, 7, [3, 11, 2 ** 62, 0]
    dn, s = noise(n, rows=3, images=4, slots=slots), Stream()
    dn.seed(seeds, s)
    rngs = [np.random.Generator(np.random.PCG64(k)) for k in seeds]
    for rows in (1, 3, 2):
        out = out_buffer(3 * T * n)
        dn.draw(out.ctypes.data, s, rows=rows, image=1, images=3, stride=4 * T * n)
        for j in range(3):
            part = out[j * T * n:(j + 1) * T * n]
            bits_equal(part[:rows * n], rngs[1 + j].standard_normal(rows * n, dtype=np.float32),
                       f"image {1 + j} rows {rows}")
            assert np.isnan(part[rows * n:]).all(), f"image {1 + j}: written past its rows"
        alone = out_buffer(n)
        dn.draw(alone.ctypes.data, s, image=0)
        bits_equal(alone, rngs[0].standard_normal(n, dtype=np.float32), "image 0")
    for i, g in enumerate(rngs):
        assert dn.state(s, image=i) == g.bit_generator.state, f"image {i}: state"
    assert dn.flags(s) == 0
    with pytest.raises(ValueError, match="images 2 .. 4 of 4"):
        dn.draw(out.ctypes.data, s, image=2, images=3, stride=4 * T * n)
    with pytest.raises(ValueError, match="overlap"):
        dn.draw(out.ctypes.data, s, rows=2, images=2, stride=4 * n)


def test_wide_ambiguity_window_raises_the_flag(noise, monkeypatch):
    monkeypatch.setattr(DeviceNoise, "window_log2", 45)   # 2^45 ulps: every wedge test is "too close"
    dn, s = noise(4000), Stream()
    dn.seed([1], s)
    out = out_buffer(4000)
    dn.draw(out.ctypes.data, s)
    assert dn.flags(s) & FLAG_AMBIGUOUS


def test_a_draw_that_runs_out_of_words_raises_the_flag(noise):
    dn, s = noise(12288), Stream()
    dn.W = dn.groups * 32 - 32 * 20          # fewer words than 12288 normals need (~270 holes)
    dn.groups = dn.W // 32
    dn.seed([0], s)
    out = out_buffer(12288)
    dn.draw(out.ctypes.data, s)
    assert dn.flags(s) & FLAG_SHORT


def test_kernel_log1pf_is_this_libm_and_the_numpy_port(lib):
    u = -noise_ref.next_float(np.arange(0, 1 << 24, 97, dtype=np.uint32) << np.uint32(8))
    out, amb = np.empty_like(u), np.zeros(u.size, np.uint8)
    for mode in (noise_ref.LOG1PF_FDLIBM, noise_ref.LOG1PF_ROUNDED):
        lib.emu_log1pf(ctypes.c_void_p(u.ctypes.data), ctypes.c_void_p(out.ctypes.data),
                       ctypes.c_void_p(amb.ctypes.data), ctypes.c_long(u.size), mode, noise_ref.WINDOW_LOG2)
        want, want_amb = noise_ref.numpy_log1pf(u, mode, noise_ref.WINDOW_LOG2)
        ok = ~want_amb.astype(bool)
        bits_equal(out[ok], want[ok], f"log1pf mode {mode}")
        assert np.array_equal(amb.astype(bool), want_amb), f"log1pf mode {mode}: ambiguity"
    if noise_ref.numpy_noise_mode() == (noise_ref.LOG1PF_FDLIBM, True):   # this libm is glibc's fdlibm
        lib.libm_mismatches.restype = ctypes.c_long
        assert lib.libm_mismatches() == 0


class Event:
    def record(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


class SamplerBackend(EmuBackend):
    """The sampler over host memory: noise_* kernels emulated, every other kernel a no-op (so x
    keeps x_T and the noise rows stay as drawn). A jetson_unet.backends.base.Backend with no
    compiler: its one module comes from compile_source."""
    name = "emu-noise"
    supports_graphs = False
    compiler = None

    def __init__(self, lib) -> None:
        self.lib = lib

    def arch(self) -> int:
        return 87

    def sm_count(self) -> int:
        return 8

    def device_name(self) -> str:
        return "emu"

    def mem_info(self):
        return 8 << 30, 8 << 30

    def stream(self) -> Stream:
        return Stream()

    def event(self, timing: bool = True) -> Event:
        return Event()

    def wait(self, stream, event) -> None:
        pass

    def integrated(self) -> bool:
        return False

    def nvtx_push(self, name: str) -> None:
        pass

    def nvtx_pop(self) -> None:
        pass

    def capture_begin(self, stream) -> None:
        raise AssertionError("no graphs on this backend")

    def capture_end(self, stream):
        raise AssertionError("no graphs on this backend")

    def load_cubin(self, path, symbols=()):
        raise AssertionError("a backend without a compiler is never handed a cubin")

    def compile_source(self, source, name, options, symbols=()):
        return self

    def get(self, symbol: str):
        return EmuFunction(self.lib, symbol) if symbol.startswith("noise_") else NoOp()


class NoOp:
    def launch(self, *args, **kw) -> None:
        pass


@pytest.mark.parametrize("window", [noise_ref.WINDOW_LOG2, 45], ids=["exact", "flagged"])
def test_sampler_device_noise_feeds_the_spec_stream(lib, monkeypatch, window, notes):
    """gpu mode with noise="device" end to end on the emulated kernels: x_T lands in the executor's
    NHWC input and each noisy step's row in the sampler's row buffer (image-major, [B][T][CHW]), both
    each image's own stream of the spec; a flagged run (the ambiguity hook) is redrawn on the host
    into the same buffers."""
    from jetson_unet.model.config import Schedule, UNetConfig
    from jetson_unet.build.loader import KernelSet
    from jetson_unet.sampling.gpu import GpuSampler
    from jetson_unet.model.schedule import NoiseStream, make_steps
    from jetson_unet.model.weights import random_params

    cfg = UNetConfig(image_size=16, dim=8, dim_mults=(1, 2), time_dim=32, schedule=Schedule(timesteps=10, beta_end=0.005))

    class Wt:
        config, params = cfg, random_params(cfg, 0)

    monkeypatch.setattr(KernelSet, "_cache", {})
    monkeypatch.setattr(DeviceNoise, "window_log2", window)
    s = GpuSampler(Wt(), "fp32", 2, mode="gpu", graphs=False, backend=SamplerBackend(lib), noise="device")
    steps = make_steps(cfg.schedule, "ddpm")
    x = s.run(steps, seeds=[4, 9])             # the no-op steps leave x_T in place
    ref = NoiseStream([4, 9], (2, 3, 16, 16))
    bits_equal(x.reshape(-1), ref.draw().reshape(-1), "x_T")
    n, noisy, T = x[0].size, sum(st.sigma > 0 for st in steps), cfg.timesteps
    rows = np.empty((2, T, n), np.float32)   # image-major
    ctypes.memmove(rows.ctypes.data, s._off["noise"], rows.nbytes)
    for r in range(noisy):
        want = ref.draw()
        for i in range(2):
            bits_equal(rows[i, r], want[i].reshape(-1), f"image {i} row {r}")
    assert sum("again with host noise" in n for n in notes) == (window > noise_ref.WINDOW_LOG2)
    s.close()
