#!/usr/bin/env python3
"""Render every glyph of Noto Color Emoji to 64x64 RGB on white: the training set.

    python -m tools.make_dataset --out .data/emoji64.npz [--font PATH] [--limit N] [--size 64]

Output (.npz, compressed, byte-identical on every run):
    images      uint8 (N, S, S, 3)   glyph centred on white, aspect kept, 2 px margin at 64
    codepoints  str   (N,)           every sequence that maps to the glyph, space-separated;
                                     each is '_'-joined lowercase hex (Noto's file naming),
                                     e.g. "1f9d1_200d_1f4bc 1f4bc_200d_1f9d1" (the font also
                                     carries the segment-reversed form for right-to-left runs)
    kinds       str   (N,)           single | keycap | flag | skin_tone | zwj | other

Glyphs are enumerated from the font itself: the cmap (single code points) and the GSUB
ligatures of its `ccmp` lookups (keycaps, flags, skin tones, ZWJ sequences). Each distinct
glyph appears once, however many sequences reach it. The pixels are the font's own CBDT
bitmaps (PNG, 136x128 at 109 ppem), read with fontTools rather than laid out with
`ImageFont.truetype(..., embedded_color=True)`: that gives exactly the glyph the font maps a
sequence to without depending on Pillow having raqm/HarfBuzz, and the same bytes on every
machine.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import zipfile
from collections import Counter

import numpy as np
from PIL import Image

DEFAULT_FONT = "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf"
APT_LINE = "apt-get update && apt-get install -y fonts-noto-color-emoji"
KINDS = ("single", "keycap", "flag", "skin_tone", "zwj", "other")

ZWJ, KEYCAP = 0x200D, 0x20E3
SKIN_TONES = range(0x1F3FB, 0x1F400)
REGIONAL = range(0x1F1E6, 0x1F200)
TAGS = range(0xE0020, 0xE0080)
BLACK_FLAG = 0x1F3F4  # base of the tag-sequence subdivision flags (England, Scotland, Wales)


def is_private_use(cp: int) -> bool:
    # Noto also maps some keycap/flag ligatures to PUA code points (legacy aliases): they are
    # not Unicode emoji, and listing them would mislabel those glyphs as "single".
    return 0xE000 <= cp <= 0xF8FF or cp >= 0xF0000


class DatasetError(Exception):
    """A problem with the inputs that the CLI reports as one line (exit 2)."""


def seq_name(seq: tuple) -> str:
    return "_".join("%04x" % cp for cp in seq)


def kind_of(seq: tuple) -> str:
    if len(seq) == 1:
        return "single"
    if KEYCAP in seq:
        return "keycap"
    if all(cp in REGIONAL for cp in seq) or (seq[0] == BLACK_FLAG and seq[1] in TAGS):
        return "flag"
    if ZWJ in seq:
        return "zwj"
    if any(cp in SKIN_TONES for cp in seq):
        return "skin_tone"
    return "other"


def load_font(path: str):
    if not os.path.isfile(path):
        raise DatasetError(f"font not found: {path} (install it: {APT_LINE}; or pass --font PATH)")
    try:
        from fontTools.ttLib import TTFont
    except ImportError:
        raise DatasetError("fontTools is missing: pip install fonttools (or pip install -e .[train])")
    font = TTFont(path)
    if "CBDT" not in font or "GSUB" not in font:
        raise DatasetError(f"{path} has no CBDT/GSUB tables: expected Noto Color Emoji ({APT_LINE})")
    return font


def enumerate_glyphs(font) -> tuple[dict, int]:
    """Map glyph name -> sorted list of code point sequences that reach it.

    Only glyphs with a colour bitmap count; returns (glyphs, number of bitmaps unreachable
    from any sequence, e.g. the font's fallback flag for a lone regional indicator)."""
    cmap = font.getBestCmap()
    rev = {g: cp for cp, g in cmap.items()}
    strike = font["CBDT"].strikeData[0]
    seqs: dict[str, set] = {}
    for cp, g in cmap.items():
        if not is_private_use(cp):
            seqs.setdefault(g, set()).add((cp,))
    gsub = font["GSUB"].table
    used = {i for rec in gsub.FeatureList.FeatureRecord for i in rec.Feature.LookupListIndex}
    for i in sorted(used):
        lookup = gsub.LookupList.Lookup[i]
        if lookup.LookupType != 4:  # only ligatures turn sequences into new glyphs
            continue
        for sub in lookup.SubTable:
            for first, ligs in sub.ligatures.items():
                for lig in ligs:
                    comps = [first] + list(lig.Component)
                    if all(c in rev for c in comps):
                        seqs.setdefault(lig.LigGlyph, set()).add(tuple(rev[c] for c in comps))
    glyphs = {g: sorted(s) for g, s in seqs.items() if g in strike}
    return glyphs, len(set(strike) - set(glyphs))


def glyph_kind(seqs: list) -> str:
    # A glyph reached by a single code point is a "single" even if a sequence also reaches it.
    return "single" if any(len(s) == 1 for s in seqs) else kind_of(seqs[0])


def render(png: bytes, size: int) -> np.ndarray:
    """CBDT PNG -> (size, size, 3) uint8: crop to the ink, composite on white, fit, centre."""
    rgba = Image.open(io.BytesIO(png)).convert("RGBA")
    box = rgba.getchannel("A").getbbox()
    if box is None:
        raise DatasetError("empty glyph bitmap")
    rgba = rgba.crop(box)
    # Composite at full resolution first: the background is uniform white, so resampling the
    # flattened RGB equals resampling premultiplied colour, with no dark fringes.
    flat = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    flat.alpha_composite(rgba)
    inner = size - max(1, size // 32) * 2  # a small white margin so no glyph touches the edge
    w, h = rgba.size
    scale = inner / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    small = flat.convert("RGB").resize((nw, nh), Image.LANCZOS)
    out = Image.new("RGB", (size, size), (255, 255, 255))
    out.paste(small, ((size - nw) // 2, (size - nh) // 2))
    return np.asarray(out, dtype=np.uint8)


def write_npz(path: str, arrays: dict) -> None:
    """np.savez_compressed, but with fixed zip timestamps so equal data gives equal bytes."""
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arrays[key]), allow_pickle=False)
    os.replace(tmp, path)


def build(font_path: str, size: int = 64, limit: int | None = None) -> dict:
    font = load_font(font_path)
    glyphs, unreachable = enumerate_glyphs(font)
    strike = font["CBDT"].strikeData[0]
    order = sorted(glyphs, key=lambda g: glyphs[g][0])  # by first code point sequence
    if limit is not None:
        order = order[:limit]
    images = np.empty((len(order), size, size, 3), dtype=np.uint8)
    for n, g in enumerate(order):
        try:
            images[n] = render(strike[g].imageData, size)
        except DatasetError as e:
            raise DatasetError(f"glyph {g} ({seq_name(glyphs[g][0])}): {e}")
    return {
        "images": images,
        "codepoints": np.array([" ".join(seq_name(s) for s in glyphs[g]) for g in order]),
        "kinds": np.array([glyph_kind(glyphs[g]) for g in order]),
        "unreachable": unreachable,
    }


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".data/emoji64.npz", help="output .npz (default: %(default)s)")
    ap.add_argument("--font", default=DEFAULT_FONT, help="CBDT colour emoji font (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N glyphs in sorted order")
    ap.add_argument("--size", type=int, default=64, help="image side in pixels (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        print("error: --limit must be >= 1", file=sys.stderr)
        return 2
    try:
        data = build(args.font, args.size, args.limit)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    unreachable = data.pop("unreachable")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_npz(args.out, data)
    counts = Counter(data["kinds"].tolist())
    print(", ".join(f"{k}: {counts.get(k, 0)}" for k in KINDS)
          + f"; skipped {unreachable} bitmap(s) no sequence reaches")
    mib = os.path.getsize(args.out) / 2**20
    print(f"wrote {args.out}: images {data['images'].shape} uint8, {mib:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
