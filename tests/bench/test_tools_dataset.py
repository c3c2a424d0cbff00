"""tools.make_dataset: kind labels always; rendering where the Noto font and fontTools are.

The font is a system package (fonts-noto-color-emoji) and fontTools is in the `train` extra, so
CI without them runs only the classification and the missing-font error.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tools import make_dataset as md

ROOT = Path(__file__).resolve().parents[2]
HAVE_FONT = Path(md.DEFAULT_FONT).is_file() and importlib.util.find_spec("fontTools") is not None
needs_font = pytest.mark.skipif(not HAVE_FONT, reason=f"needs {md.DEFAULT_FONT} and fontTools ({md.APT_LINE})")


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.make_dataset", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("seq, kind", [
    ((0x1F600,), "single"),
    ((0x0023, 0x20E3), "keycap"),
    ((0x1F1FA, 0x1F1F8), "flag"),                                            # US
    ((0x1F3F4, 0xE0067, 0xE0062, 0xE0065, 0xE006E, 0xE0067, 0xE007F), "flag"),  # England
    ((0x1F44D, 0x1F3FD), "skin_tone"),
    ((0x1F469, 0x1F3FD, 0x200D, 0x1F4BB), "zwj"),                            # ZWJ wins over tone
    ((0x1F468, 0x200D, 0x1F469, 0x200D, 0x1F467), "zwj"),
])
def test_kind_of(seq, kind) -> None:
    assert md.kind_of(seq) == kind
    assert md.seq_name(seq).split("_")[0] == "%04x" % seq[0]


def test_missing_font_is_one_line_exit_2(tmp_path: Path) -> None:
    r = run_tool("--out", str(tmp_path / "x.npz"), "--font", str(tmp_path / "nope.ttf"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: font not found")
    assert "apt-get install -y fonts-noto-color-emoji" in r.stderr
    assert not (tmp_path / "x.npz").exists()


@needs_font
def test_small_dataset_shape_background_determinism(tmp_path: Path) -> None:
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    for out in (a, b):
        r = run_tool("--out", str(out), "--limit", "12")
        assert r.returncode == 0, r.stderr
    assert a.read_bytes() == b.read_bytes(), "two runs gave different bytes"
    with np.load(a, allow_pickle=False) as npz:
        images, names, kinds = npz["images"], npz["codepoints"], npz["kinds"]
    assert images.shape == (12, 64, 64, 3), images.shape
    assert images.dtype == np.uint8, images.dtype
    assert names.shape == kinds.shape == (12,)
    assert set(kinds.tolist()) <= set(md.KINDS)
    # The 2 px margin is pure white on every image; every glyph leaves some ink inside it.
    border = np.concatenate([images[:, :2].reshape(12, -1), images[:, -2:].reshape(12, -1),
                             images[:, :, :2].reshape(12, -1), images[:, :, -2:].reshape(12, -1)], 1)
    assert (border == 255).all(), "margin is not white"
    assert (images.reshape(12, -1).min(axis=1) < 128).all(), "an image is (nearly) blank"
    assert len(set(names.tolist())) == 12, "duplicate glyph names"


@needs_font
def test_size_option_and_sorted_names(tmp_path: Path) -> None:
    data = md.build(md.DEFAULT_FONT, size=32, limit=6)
    assert data["images"].shape == (6, 32, 32, 3)
    firsts = [tuple(int(c, 16) for c in n.split(" ")[0].split("_")) for n in data["codepoints"]]
    assert firsts == sorted(firsts), "glyphs are not in code point order"
