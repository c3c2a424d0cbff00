"""The one arena planner: tensor lifetimes -> byte offsets in ONE device allocation.

Rules:
- Every `cat` op of the plan is resolved as aliasing: its inputs become views of its output at
  channel offsets 0 and C_a. Producers write straight into the concat buffer (activations are
  NHWC on the device, so a view is a channel offset plus a pixel stride `ld` = root channels);
  no copy kernel exists. A tensor may sit in at most one concat buffer.
- A root's lifetime is the union of its views' lifetimes; roots whose lifetimes are disjoint
  may share bytes. Offsets are aligned (256 B by default) so every region starts on a boundary
  that any vector load accepts.
- Placement is greedy by size (largest first, lowest offset that does not collide with an
  already placed root whose lifetime intersects). The lower bound is the peak of live bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from jetson_unet.model import plan as P
from jetson_unet.errors import ArenaError
from jetson_unet.model.plan import Plan, lifetimes

ExtraRegion = Tuple[str, int, int, int]   # (name, nbytes, first op index, last op index)


@dataclass(frozen=True)
class Region:
    root: str
    offset: int      # bytes from the arena base to this tensor's first element
    ld: int          # pixel stride in elements (NHWC): the root's channel count
    channels: int
    size: int        # H == W (0 for extra regions)
    nbytes: int      # B * channels * H * W * elem of this tensor (a view is strided: its span is wider)


@dataclass(frozen=True)
class ArenaPlan:
    regions: Dict[str, Region]
    roots: Dict[str, Tuple[int, int, int, int]]   # root -> (offset, nbytes, first, last)
    nbytes: int
    sum_bytes: int
    peak_live_bytes: int
    align: int

    def check_no_overlap(self) -> None:
        """Raise ArenaError if two simultaneously live roots share a byte."""
        items = sorted(self.roots.items(), key=lambda kv: kv[1][0])
        for i, (a, (oa, na, fa, la)) in enumerate(items):
            for b, (ob, nb, fb, lb) in items[i + 1:]:
                if ob >= oa + na:
                    break
                if fa <= lb and fb <= la:
                    raise ArenaError(f"arena overlap: {a} [{oa}, {oa + na}) ops {fa}..{la} and "
                                     f"{b} [{ob}, {ob + nb}) ops {fb}..{lb}")

    def report(self) -> str:
        return (f"arena {self.nbytes / 2**20:.2f} MiB; sum of activations {self.sum_bytes / 2**20:.2f} MiB; "
                f"peak live (lower bound) {self.peak_live_bytes / 2**20:.2f} MiB; "
                f"ratio to lower bound {self.nbytes / max(self.peak_live_bytes, 1):.3f}")


ALIGN = 256   # every region of a device allocation (the arena, the weights, the sampler's tables)


def aligned(n: int, align: int = ALIGN) -> int:
    return _round_up(int(n), align)


def regions(sizes: Dict[str, int]) -> Tuple[Dict[str, int], int]:
    """Named regions of one allocation, in order, each ALIGN-aligned: (offsets, total bytes)."""
    offs, total = {}, 0
    for k, v in sizes.items():
        offs[k] = total
        total += aligned(v)
    return offs, total


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def cat_parents(plan: Plan) -> Dict[str, Tuple[str, int]]:
    """Tensor -> (concat buffer it is a view of, channel offset)."""
    parent: Dict[str, Tuple[str, int]] = {}
    for op in plan.ops:
        if op.kind != P.CAT:
            continue
        a, b = op.inputs
        for name, c0 in ((a, 0), (b, plan.tensors[a].channels)):
            if name in parent:
                raise ArenaError(f"tensor {name!r} feeds two concatenations; it cannot sit in both")
            if name == plan.input:
                raise ArenaError("the plan input cannot be a view of a concat buffer")
            parent[name] = (op.out, c0)
    return parent


def _resolve(name: str, parent: Mapping[str, Tuple[str, int]]) -> Tuple[str, int]:
    c0 = 0
    while name in parent:
        name, off = parent[name]
        c0 += off
    return name, c0


def plan_arena(plan: Plan, batch: int, elem_bytes: Mapping[str, int],
               extra: Sequence[ExtraRegion] = (), align: int = 256) -> ArenaPlan:
    if batch < 1:
        raise ArenaError(f"batch must be >= 1, got {batch}")
    life = lifetimes(plan)
    parent = cat_parents(plan)
    members: Dict[str, List[str]] = {}
    for name in life:
        root, _ = _resolve(name, parent)
        members.setdefault(root, []).append(name)
    spans: Dict[str, Tuple[int, int, int]] = {}   # root -> (nbytes, first, last)
    for root, names in members.items():
        t = plan.tensors[root]
        for n in names:
            if elem_bytes[n] != elem_bytes[root]:
                raise ArenaError(f"view {n!r} and its concat buffer {root!r} differ in element size")
        first = min(life[n][0] for n in names)
        last = max(life[n][1] for n in names)
        spans[root] = (batch * t.numel * elem_bytes[root], first, last)
    for name, nbytes, first, last in extra:
        if name in spans:
            raise ArenaError(f"extra region {name!r} clashes with a tensor name")
        spans[name] = (int(nbytes), first, last)
    offsets = _place(spans, align)
    roots = {r: (offsets[r],) + spans[r] for r in spans}
    regions: Dict[str, Region] = {}
    for name in life:
        root, c0 = _resolve(name, parent)
        t, rt = plan.tensors[name], plan.tensors[root]
        eb = elem_bytes[name]
        regions[name] = Region(root, offsets[root] + c0 * eb, rt.channels, t.channels, t.size,
                               batch * t.numel * eb)
    for name, nbytes, _, _ in extra:
        regions[name] = Region(name, offsets[name], 0, 0, 0, int(nbytes))
    nbytes = max((offsets[r] + spans[r][0] for r in spans), default=0)
    return ArenaPlan(regions, roots, _round_up(nbytes, align),
                     sum(s[0] for s in spans.values()), _peak_live(spans.values()), align)


def _place(spans: Mapping[str, Tuple[int, int, int]], align: int) -> Dict[str, int]:
    placed: List[Tuple[int, int, int, int]] = []   # (offset, end, first, last)
    offsets: Dict[str, int] = {}
    for name in sorted(spans, key=lambda n: (-spans[n][0], spans[n][1], n)):
        size, first, last = spans[name]
        busy = sorted((o, e) for o, e, f, l in placed if f <= last and first <= l)
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, _round_up(e, align))
        offsets[name] = offset
        placed.append((offset, offset + size, first, last))
    return offsets


def _peak_live(spans: Iterable[Tuple[int, int, int]]) -> int:
    events: Dict[int, int] = {}
    for size, first, last in spans:
        events[first] = events.get(first, 0) + size
        events[last + 1] = events.get(last + 1, 0) - size
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def activation_elem_bytes(plan: Plan, act_bytes: int, io_bytes: int = 4,
                          io: Optional[Iterable[str]] = None) -> Dict[str, int]:
    """Element size per tensor: the precision's for activations, fp32 for the image and eps."""
    io_names = set(io) if io is not None else {plan.input, plan.output}
    return {n: (io_bytes if n in io_names else act_bytes) for n, t in plan.tensors.items() if t.size}


def view_layout(plan: Plan) -> Dict[str, Tuple[int, int]]:
    """Tensor -> (pixel stride = root channels, channel offset in the root), from the cat aliasing."""
    parent = cat_parents(plan)
    out = {}
    for name, t in plan.tensors.items():
        if not t.size:
            continue
        root, c0 = name, 0
        while root in parent:
            root, off = parent[root]
            c0 += off
        out[name] = (plan.tensors[root].channels, c0)
    return out
