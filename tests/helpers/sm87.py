"""ptxas's report (`nvcc -cubin -arch=sm_87 -Xptxas -v`) of the conv kernels the sm_87 checks hold to
their register, spill, smem and code-size budgets, each kernel compiled once per test session.

Why shared: seven tests check overlapping sets of kernels of the default config (fp16, Orin's 8 SMs,
batch 1 and 16): the built-in tiles' cp.async convs and the deep-ring candidates
(tests/host/test_conv_pipelined_cpu.py), the halo, row, k-sliced, gate and sub-pixel candidates
(tests/emulated/test_conv_halo_emulated.py). Compiled test by test they were 299 kernels, 243 of them
distinct. The session's `Ptxas` (tests/conftest.py's `ptxas87` fixture, which the depthwise and init
conv checks use too) compiles each kernel the first time a test asks for it and keeps its report.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence

from jetson_unet.build.sources import module_source, nvrtc_options
from jetson_unet.model.arena import view_layout
from jetson_unet.model.config import UNetConfig
from jetson_unet.model.plan import CONV, GATE, Op, build_plan
from jetson_unet.model.weights import random_params
from jetson_unet.ops.common import Ctx, TileChoice
from jetson_unet.ops.conv_pipe import deep_ring
from jetson_unet.ops.keys import ConvKey
from jetson_unet.ops.specs import op_key, op_spec
from jetson_unet.ops.tuning import candidates, tunable

JOBS = max(1, min(4, os.cpu_count() or 1))   # sm87_ptxas: nvcc processes side by side (ptxas's time is per kernel)


# ---- which kernels each check looks at ------------------------------------------------------------

class Kernel(NamedTuple):
    op: Op
    tile: Optional[TileChoice]   # a candidate the tuner may time; None: the op's built-in tile
    ctx: Ctx                     # the op's context with that tile (ops.specs.op_spec(op, ctx): its spec)
    key: Any


@functools.lru_cache(maxsize=None)
def kernels() -> List[Kernel]:
    """The default config's GEMM convs and gates, fp16 on 8 SMs at batch 1 and 16: each op's built-in
    tile (what GpuExecutor launches where no tuning file matches) and every tile the tuner may time."""
    cfg = UNetConfig()
    plan, params = build_plan(cfg), random_params(cfg, 0)
    out = []
    for batch in (1, 16):
        ctx = Ctx(plan, params, "fp16", batch, 8, view_layout(plan))
        for op in plan.ops:
            if op.kind in (CONV, GATE):
                out.append(Kernel(op, None, ctx, op_key(op, ctx)))
            if tunable(op, ctx):
                for t in candidates(op, ctx):
                    tiled = dataclasses.replace(ctx, tiles={op.out: t})
                    out.append(Kernel(op, t, tiled, op_key(op, tiled)))
    return out


def _candidate(pick: Callable[[Op, TileChoice], bool]) -> Callable[[Kernel], bool]:
    """Candidates `pick` selects but those with a deep ring (their own set: it allows a few spills)."""
    return lambda k: k.tile is not None and not deep_ring(k.key) and pick(k.op, k.tile)


SETS: Dict[str, Callable[[Kernel], bool]] = {
    "built-in": lambda k: k.tile is None and isinstance(k.key, ConvKey) and bool(k.key.stages),
    "deep ring": lambda k: k.tile is not None and deep_ring(k.key),
    "halo": _candidate(lambda op, t: t.halo == 1),
    "rows": _candidate(lambda op, t: t.halo == 2),
    "k slices": _candidate(lambda op, t: t.ks > 1),
    "gate": _candidate(lambda op, t: op.kind == GATE),
    "sub-pixel": _candidate(lambda op, t: op.in_map == "up2" and bool(t.stages) and not t.halo),
}


def picked(name: str) -> List[Kernel]:
    return [k for k in kernels() if SETS[name](k)]


def keys(name: str) -> List[Any]:
    return sorted({k.key for k in picked(name)}, key=lambda key: key.symbol)


def dynamic_smem(name: str) -> Dict[str, int]:
    """{symbol: the most dynamic smem of its launches} of set `name` (op_spec: packs the weights)."""
    out: Dict[str, int] = {}
    for k in picked(name):
        out[k.key.symbol] = max(out.get(k.key.symbol, 0), op_spec(k.op, k.ctx).smem)
    return out


# ---- nvcc and ptxas's report ------------------------------------------------------------------------

def ptxas_report(text: str) -> dict:
    """`-Xptxas -v` output -> {function: {regs, smem, stack, spill}}."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = out.setdefault(m.group(1), {"regs": 0, "smem": 0, "stack": 0, "spill": 0})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur["stack"], cur["spill"] = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers.*?(?:(\d+) bytes smem)?", line)
        if m and cur is not None and "Used" in line:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return out


def code_bytes(cubin: bytes) -> Dict[str, int]:
    """{kernel: bytes of its machine code}: the sizes of a cubin's `.text.<kernel>` sections (ELF64)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx][4]   # the section-name string table's file offset

    def name(at: int) -> str:
        return cubin[names + at:cubin.index(b"\0", names + at)].decode()
    return {name(h[0])[6:]: h[5] for h in heads if name(h[0]).startswith(".text.")}


def compile_sm87(nvcc: str, keys: Sequence[Any], stem: Path) -> dict:
    """The module of `keys` compiled by nvcc for sm_87 with the runtime's include options: ptxas's
    report per kernel, with its code's bytes ("text")."""
    opts = [o for o in nvrtc_options(87) if o.startswith(("-std", "-I"))]
    src = stem.with_suffix(".cu")
    src.write_text(module_source(keys))
    done = subprocess.run([nvcc, "-cubin", "-arch=sm_87", *opts, "-Xptxas", "-v", str(src), "-o",
                           str(stem.with_suffix(".cubin"))], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    text = done.stdout + done.stderr
    assert done.returncode == 0, f"nvcc exited {done.returncode}: {text[-4000:]}"
    rep = ptxas_report(text)
    for sym, size in code_bytes(stem.with_suffix(".cubin").read_bytes()).items():
        if sym in rep:   # entry functions (a non-inlined device function has a section too)
            rep[sym]["text"] = size
    return rep


def sm87_ptxas(nvcc: str, keys: Iterable[Any], folder: Path) -> dict:
    """compile_sm87 of `keys`, split over JOBS nvcc processes side by side (ptxas's time is per kernel)."""
    keys = list(keys)
    jobs = max(1, min(JOBS, len(keys)))
    with ThreadPoolExecutor(jobs) as pool:
        parts = pool.map(lambda j: compile_sm87(nvcc, keys[j::jobs], folder / f"sm87_{j}"), range(jobs))
    return {sym: f for part in parts for sym, f in part.items()}


class Ptxas:
    """ptxas's reports of one test session: each kernel compiled the first time it is asked for."""

    def __init__(self, nvcc: str, folder: Path) -> None:
        self.nvcc, self.folder, self.seen = nvcc, folder, {}   # seen: key -> its report
        self.count = itertools.count()

    def report(self, keys: Iterable[Any]) -> dict:
        """{symbol: {regs, smem, stack, spill, text}} of `keys`."""
        keys = list(dict.fromkeys(keys))
        new = [k for k in keys if k not in self.seen]
        if new:
            folder = self.folder / f"build{next(self.count)}"
            folder.mkdir()
            rep = sm87_ptxas(self.nvcc, new, folder)
            self.seen.update((k, rep[k.symbol]) for k in new)
        return {k.symbol: self.seen[k] for k in keys}
