"""The device noise generator's algorithm (runtime/gpu/noise_ref.py, the NumPy model of
kernels/noise.cu) against NumPy itself: PCG64 words and jumps against random_raw / advance, whole
draws of float32 normals bit for bit over many seeds and sizes, consecutive draws (NumPy's buffered
half-word), the state dict after them, and the checks that pick the tail's log1pf."""
from __future__ import annotations

import numpy as np
import pytest

from jetson_unet.errors import NoiseUnsupported
from jetson_unet.ops import noise_ref as nr
from jetson_unet.ops.noise import pack_states, unpack_state


def numpy_draw(seed: int, n: int) -> np.ndarray:
    return np.random.Generator(np.random.PCG64(seed)).standard_normal(n, dtype=np.float32)


def bits_equal(got: np.ndarray, want: np.ndarray, label: str) -> None:
    diff = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    assert diff.size == 0, f"{label}: {diff.size} of {want.size} normals differ, first at {diff[:4].tolist()}"


@pytest.mark.parametrize("buffered", [False, True])
def test_stream_words_are_pcg64_outputs_low_half_first(buffered):
    bg = np.random.PCG64(5)
    if buffered:
        bg.random_raw()
        st = bg.state
        st.update(has_uint32=1, uinteger=0xDEADBEEF)
    else:
        st = bg.state
    words = nr.stream_words(st, 1001)
    raw = np.random.PCG64(5)
    raw.state = st
    want = raw.random_raw(501).view(np.uint32)          # random_raw ignores the buffered half
    if buffered:
        want = np.concatenate([[0xDEADBEEF], want])
    assert np.array_equal(words, want[:1001])


def test_jump_ahead_is_numpy_advance():
    st = np.random.PCG64(9).state["state"]
    d = np.array([0, 1, 2, 15, 16, 1000, 123457, 2 ** 40 + 3], np.uint64)
    s = nr.pcg_jump(nr._u128(st["state"], len(d)), nr._u128(st["inc"], len(d)), d)
    for j, dj in enumerate(d.tolist()):
        bg = np.random.PCG64(9)
        bg.advance(dj)
        assert (int(s[0][j]) << 64) | int(s[1][j]) == bg.state["state"]["state"], dj


@pytest.mark.parametrize("n", [1, 2, 3, 17, 255, 12288, 16 * 12288])
def test_draw_equals_numpy_and_its_state(n):
    for seed in range(12 if n < 1000 else 3):
        out, state, flags = nr.draw(np.random.PCG64(seed).state, n)
        g = np.random.Generator(np.random.PCG64(seed))
        bits_equal(out, g.standard_normal(n, dtype=np.float32), f"seed {seed} n {n}")
        assert flags == 0 and state == g.bit_generator.state, f"seed {seed} n {n}"


def test_consecutive_draws_carry_the_buffered_half_word():
    rng = np.random.default_rng(1)
    for seed in range(30):
        g = np.random.Generator(np.random.PCG64(seed))
        state = g.bit_generator.state
        for k in range(5):
            n = int(rng.integers(1, 2500))              # odd word counts leave a half-word buffered
            out, state, flags = nr.draw(state, n)
            bits_equal(out, g.standard_normal(n, dtype=np.float32), f"seed {seed} draw {k} n {n}")
            assert flags == 0 and state == g.bit_generator.state, f"seed {seed} draw {k}"


def test_hundred_rows_of_batch_one():
    """x_T and 99 noise rows of a 100-step DDPM image (1 x 3 x 64 x 64)."""
    g = np.random.Generator(np.random.PCG64(42))
    state = g.bit_generator.state
    for r in range(100):
        out, state, flags = nr.draw(state, 12288)
        bits_equal(out, g.standard_normal((1, 3, 64, 64), dtype=np.float32).reshape(-1), f"row {r}")
        assert flags == 0
    assert state == g.bit_generator.state


def test_draws_cover_every_path():
    """The seeds above reach the tail, rejected wedges and specials inside earlier attempts."""
    words = nr.stream_words(np.random.PCG64(0).state, nr.n_words(16 * 12288))
    _, special = nr.fast_values(words)
    att = nr.attempt(words, np.nonzero(special)[0])
    tails, rejected = att.cons >= 3, ~att.acc
    inside = att.p[1:] < (att.p + att.cons)[:-1]
    assert tails.sum() >= 20 and rejected.sum() >= 1000 and inside.sum() >= 20
    assert (att.cons >= 5).any(), "a tail that needed a second try"


def test_margin_is_never_approached():
    for n in (1, 37, 12288, 16 * 12288):
        W = nr.n_words(n)
        assert W % 32 == 0 and W > n
    n = 16 * 12288
    used = []
    for seed in range(4):
        words = nr.stream_words(np.random.PCG64(seed).state, nr.n_words(n))
        _, special = nr.fast_values(words)
        used.append(nr.walk(nr.attempt(words, np.nonzero(special)[0]), n)[2] - n)
    assert max(used) < nr.HOLE_MEAN * n + 5 * nr.HOLE_SD * np.sqrt(n) < nr.n_words(n) - n


def test_ambiguous_wedges_and_short_draws_are_flagged():
    state = np.random.PCG64(3).state
    assert nr.draw(state, 5000, window=45)[2] & nr.FLAG_AMBIGUOUS     # every wedge "too close"
    out, after, flags = nr.draw(state, 5000, W=5024)                   # fewer words than 5000 need
    assert flags & nr.FLAG_SHORT and after == state


def test_state_packing_round_trips():
    g = np.random.Generator(np.random.PCG64(77))
    g.standard_normal(3, dtype=np.float32)
    st = g.bit_generator.state
    a = pack_states([st], 1, 3)
    assert a.nbytes == 64 and a["log1pf_mode"][0] == 1 and a["window"][0] == 3 and a["flags"][0] == 0
    assert unpack_state(a) == st


def test_tail_probe_states_take_the_tail_with_chosen_words():
    g = np.random.Generator(np.random.PCG64(0))
    for k in (1, 12345, (1 << 24) - 1):
        g.bit_generator.state = nr.tail_state(k << 8, 0xFFFFFF00)
        got = g.standard_normal(dtype=np.float32)
        want = nr._tail_value(nr.log1pf_fdlibm(-nr.next_float(np.uint32(k << 8))))
        assert nr.numpy_noise_mode()[0] != nr.LOG1PF_FDLIBM or got == want
        assert got < -3.654


def test_this_numpy_is_supported():
    mode, exact = nr.numpy_noise_mode()
    assert mode in (nr.LOG1PF_FDLIBM, nr.LOG1PF_ROUNDED)


def test_old_numpy_is_refused(monkeypatch):
    nr.numpy_noise_mode.cache_clear()
    monkeypatch.setattr(np, "__version__", "1.21.6")
    try:
        with pytest.raises(NoiseUnsupported, match=r"NumPy >= 1\.22.*1\.21\.6"):
            nr.numpy_noise_mode()
    finally:
        nr.numpy_noise_mode.cache_clear()


def test_log1pf_ports_agree_with_correct_rounding_within_an_ulp():
    u = -nr.next_float(np.arange(0, 1 << 24, 61, dtype=np.uint32) << np.uint32(8))
    fd = nr.log1pf_fdlibm(u)
    cr, amb = nr.log1pf_rounded(u, nr.WINDOW_LOG2)
    ulps = np.abs(fd.view(np.int32).astype(np.int64) - cr.view(np.int32))
    assert ulps.max() <= 1 and 0.03 < (ulps == 1).mean() < 0.12 and not amb.any()
