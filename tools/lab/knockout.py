"""Where a U-Net call's GPU time goes, without a profiler: time the working tree against copies of it
whose kernels have one part removed (a knockout: the results are wrong, only the time counts), or
against the kernels of another git revision (an A/B of a kernel change). Runs on any CUDA GPU that
tools.bench_unet runs on, a Jetson included.

    python3 -m tools.lab.knockout gelu stats kloop gn        # each knockout alone, vs the working tree
    python3 -m tools.lab.knockout gelu+stats --batches 1     # two knockouts in one copy
    python3 -m tools.lab.knockout --ref HEAD~1               # the working tree vs HEAD~1's kernels/
    python3 -m tools.lab.knockout --ref .device/kbase        # ... vs the kernel files in a folder
    python3 -m tools.lab.knockout --ref .device/old          # ... vs a whole tree (runtime/ and kernels/)
    python3 -m tools.lab.knockout --env JETSON_UNET_TILES=DIR   # ... vs itself with a setting changed
    python3 -m tools.lab.knockout --list                     # the knockouts and what each removes
    python3 -m tools.lab.knockout kloop gn --batches 16 --per-op 20   # ... and per op (each launch alone)
    python3 -m tools.lab.knockout --ref HEAD~1 --batches 1,4 --sms 8  # ... on an 8-SM slice

Each variant, and the working tree it is timed against, is a copy in a scratch folder, without the
shipped cubins (so all of them run this machine's compiler's code), importable as itself: a real
`jetson_unet/` package (the working tree's runtime/, with kernels/ copied in as jetson_unet/kernels/
and weights/ linked as jetson_unet/models/) beside a copy of tools/. Its kernels are patched (each knockout is a list of
exact replacements in kernels/*.cu; a replacement whose text is not found exactly once fails before
anything runs) or taken from a revision (`git show REV:kernels/...`) or from a folder (what a lent
machine whose copy of the repo has no git history needs: `git archive HEAD kernels | tar -x
--strip-components=1 -C .device/kbase` first, on the host); the Python is the working tree's, except
for a folder holding runtime/ and kernels/ (`git archive HEAD runtime kernels | tar -x -C
.device/old`): a whole tree, for a change of kernels and launchers together (the tools stay the
working tree's). Every
row is `python -m tools.bench_unet --no-torch` in a fresh process whose working directory is its
tree, so a copy's own package comes before the installed one (checked before anything is timed); its
kernels are split into one module per core and compiled side by side (`--shards`, as jetson-tune
builds its candidates: each kernel's code is what one module gives it, only the build is faster);
and the variants take turns for --rounds rounds (docs/performance.md, Method). Printed last: graph
ms per variant, batch and round, and each variant's median difference to the working tree ("saves":
positive when the variant is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from jetson_unet.errors import UsageError
from jetson_unet.tune import build_shards

ROOT = Path(__file__).resolve().parents[2]   # the repository: tools/lab/knockout.py

Patch = Tuple[str, str, str]   # (file in kernels/, text found exactly once, its replacement)

KNOCKOUTS: Dict[str, Tuple[str, List[Patch]]] = {
    "gelu": ("the GEMM convs' GELU", [
        ("conv.cu", "if (gelu) gelu_rolled<A0 * A1 * A2>(&acc[0][0][0]);", "")]),
    # the GELU replaced by something of one of its costs, to tell which of them the "gelu" row is
    "gelu-mufu": ("the GELU's arithmetic, its one MUFU op (ex2) kept", [
        ("common.cuh", "return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));", "return exp2f(v);")]),
    "gelu-fma": ("the GELU's MUFU op, ~24 dependent fma kept (about erff's instruction count)", [
        ("common.cuh", "return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));",
         "float p = v;\n#pragma unroll\n    for (int i = 0; i < 24; ++i) p = fmaf(p, 0.03125f, v);\n    return p;")]),
    # not a removal: every fp16 mma.sync issued twice on the same accumulators, the tensor work of the
    # call doubled, as on a tensor core of half the rate (an Orin SM's is 0.4-0.8x an H100 SM's)
    "mma2": ("nothing removed: every fp16 mma issued twice (the tensor cores at half their rate)", [
        ("common.cuh", '"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "\n'
                       '                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"',
         '"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "\n'
         '                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\\t"\n'
         '                     "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "\n'
         '                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"')]),
    "stats": ("the GroupNorm statistics epilogue of the GEMM convs", [
        ("conv.cu", "        if (st_part) {   // GroupNorm partials", "        if (false) {   // GroupNorm partials")]),
    "store": ("the GEMM convs' output stores (the values are still computed: the statistics use them)", [
        ("conv.cu", "if (VEC > 1 && ok1) {   // VEC > 1", "if (false) {   // VEC > 1"),
        ("conv.cu", "if (ok0) o[0] = D::from_f(s0);\n"
                    "                if (ok1) o[1] = D::from_f(s1);",
         "if (s0 == 1234.5f) o[0] = D::from_f(s1);")]),
    "kloop": ("the k loops of the cp.async and halo convs (no copies, no mma)", [
        ("conv_halo.cu", "ntiles = ke - kb;", "ntiles = 0 * (ke - kb);"),
        ("conv_halo.cu", "nu = nc0 + nk1;", "nu = 0 * (nc0 + nk1);"),
        ("conv_pipe.cu", "ntiles = ke - kb;", "ntiles = 0 * (ke - kb);")]),
    "gn": ("the GroupNorm prologue of the cp.async and halo convs (merge, table or pad values)", [
        ("conv_halo.cu", "const bool norm = gn_part != nullptr;\n    const int nk", "const bool norm = false;\n    const int nk"),
        ("conv_halo.cu", "const int y0 = mt * TH;\n    const bool norm = gn_part != nullptr;",
         "const int y0 = mt * TH;\n    const bool norm = false;"),
        ("conv_pipe.cu", "const bool norm = gn_part != nullptr;", "const bool norm = false;")]),
    "gnloop": ("the GroupNorm merge's partials past the first 32 (their second round trip)", [
        ("common.cuh", "for (int i = lane + 32; i < P; i += 32 * NB) {", "for (int i = lane + 32; i < 0; i += 32 * NB) {")]),
    "nopad": ("the folded GroupNorm's pad-vector writes after each k-tile's wait", [
        ("conv_pipe.cu", "        if constexpr (FOLD) {\n            // a branch, not predicated stores",
         "        if constexpr (FOLD) {\n            return;\n            // a branch, not predicated stores"),
        ("conv_halo.cu", "if constexpr (FOLD) {   // the pad vector over", "if constexpr (FOLD) { return;   // the pad vector over")]),
    # with "nopad": what a fold that leaves the zero-filled padding alone could save at most (paying
    # for the padding in the epilogue instead cost more than the two save: docs/kernels.md)
    "nobar": ("the folded GroupNorm's pad table and the prologue's barrier (the merge stays)", [
        ("conv.cu", "if (c < Cin) t[c] = D::from_f(fmaf(-pb[r], sd, pw[r] * mean));", ""),
        ("conv.cu", "t[c] = D::from_f(fmaf(-gn_fold[Cin + c], sd, gn_fold[c] * mean));", ";"),
        ("conv.cu", "    __syncthreads();\n}\n\n// The folded GroupNorm's rstd",
         "    if (!fold) __syncthreads();\n}\n\n// The folded GroupNorm's rstd")]),
}
PACKAGE = "jetson_unet"   # the import name; the copy's package folder


def patches(variant: str) -> List[Patch]:
    """A variant's replacements: knockout names joined by '+'."""
    out: List[Patch] = []
    for name in variant.split("+"):
        if name not in KNOCKOUTS:
            raise UsageError(f"no knockout named {name!r} (known: {', '.join(KNOCKOUTS)})")
        out += KNOCKOUTS[name][1]
    return out


def apply(kernels: Path, plist: Sequence[Patch]) -> None:
    """Every replacement's text must occur exactly once in its file, else UsageError (the kernels
    changed since the knockout was written: update it here)."""
    for fname, old, new in plist:
        path = kernels / fname
        text = path.read_text()
        if text.count(old) != 1:
            raise UsageError(f"kernels/{fname}: the knockout text occurs {text.count(old)} times, not once: {old[:60]!r}")
        path.write_text(text.replace(old, new))


def whole_tree(rev: str) -> bool:
    """A --ref folder holding runtime/ and kernels/: the package and the kernels of another tree."""
    return Path(rev).is_dir() and (Path(rev) / "runtime").is_dir() and (Path(rev) / "kernels").is_dir()


def ref_names(rev: str, repo: Path = ROOT) -> List[str]:
    """The files of kernels/ at git revision `rev`, or a folder's files (a whole tree's kernels/);
    UsageError where neither is."""
    if whole_tree(rev):
        return ref_names(str(Path(rev) / "kernels"), repo)
    if Path(rev).is_dir():
        names = sorted(str(p) for p in Path(rev).iterdir() if p.is_file())
        if not any(n.endswith(".cu") for n in names):
            raise UsageError(f"--ref {rev}: a folder without kernel files (*.cu)")
        return names
    try:
        names = subprocess.run(["git", "ls-tree", "--name-only", rev, "kernels/"], cwd=repo, check=True,
                               capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        why = (getattr(e, "stderr", "") or str(e)).strip().splitlines()
        raise UsageError(f"--ref {rev}: cannot list its kernels/ ({why[-1] if why else 'git failed'})") from None
    if not names:
        raise UsageError(f"--ref {rev}: no kernels/ there")
    return names


def ref_kernels(rev: str, dest: Path, repo: Path = ROOT) -> None:
    """Overwrite dest's files with the kernels/ of git revision `rev`, or with a folder's files."""
    if whole_tree(rev):
        rev = str(Path(rev) / "kernels")
    for name in ref_names(rev, repo):
        if Path(rev).is_dir():
            shutil.copy2(name, dest / Path(name).name)
            continue
        blob = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=repo, check=True, capture_output=True).stdout
        (dest / Path(name).name).write_bytes(blob)


def _skip(folder: str, names: List[str]) -> List[str]:
    """What a tree copy leaves out: caches, and the shipped cubins (below)."""
    cubins = Path(folder).name == "cubins"
    return [n for n in names if n == "__pycache__" or (cubins and n.endswith((".cubin", ".json")))]


def make_tree(dest: Path, variant: str, ref: str = "") -> Path:
    """A copy of the working tree's package and tools, importable as itself from `dest`, its kernels
    patched (variant) or from `ref`: dest/jetson_unet (runtime/, kernels/ as jetson_unet/kernels,
    weights/ linked as jetson_unet/models) and dest/tools. The shipped cubins are left out, so every
    variant, the unchanged one too, runs code of this machine's compiler: the shipped ones' (NVRTC
    11.8; sm_90's 12.2, and 13.0 for CUDA 13 drivers) serve only an unchanged tree, and 12.2's ran
    1-5% slower on an H100 than NVRTC 13's code of the same source (docs/performance.md), which
    would otherwise count for or against any kernel change."""
    plist = patches(variant) if variant else []
    shutil.rmtree(dest, ignore_errors=True)   # a --keep folder from an earlier run
    pkg = dest / PACKAGE
    shutil.copytree(Path(ref) / "runtime" if ref and whole_tree(ref) else ROOT / "runtime", pkg, ignore=_skip)
    shutil.copytree(ROOT / "kernels", pkg / "kernels", ignore=_skip)
    try:
        (pkg / "models").symlink_to(ROOT / "weights", target_is_directory=True)
    except OSError:   # no symlinks here: copy the models
        shutil.copytree(ROOT / "weights", pkg / "models", ignore=_skip)
    shutil.copytree(ROOT / "tools", dest / "tools", ignore=_skip)
    if ref:
        ref_kernels(ref, pkg / "kernels")
    apply(pkg / "kernels", plist)
    return dest


def child_imports(tree: Path) -> Dict[str, str]:
    """What a child process in `tree` imports: the files of jetson_unet, its kernels and models
    folders and tools.bench_unet, as `python -m tools.bench_unet` there sees them."""
    code = ("import json, jetson_unet, tools.bench_unet\n"
            "from jetson_unet.paths import kernels_dir, models_dir\n"
            "print(json.dumps({'package': jetson_unet.__file__, 'kernels': str(kernels_dir()),\n"
            "                  'models': str(models_dir()), 'tools': tools.bench_unet.__file__}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tree}: a child process there cannot import jetson_unet and tools.bench_unet "
                           f"({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def expected_imports(tree: Path) -> Dict[str, Path]:
    """Where a child process in a copy `tree` must find the package, its kernels and models, and the
    tools: the copy's own."""
    pkg = tree / PACKAGE
    want = {"package": pkg, "kernels": pkg / "kernels", "models": pkg / "models"}
    return {k: v.resolve() for k, v in dict(want, tools=tree / "tools").items()}


def check_tree(tree: Path) -> None:
    """RuntimeError unless a child process in the copy `tree` imports that tree's package, kernels,
    models and tools, not the installed package's."""
    got = child_imports(tree)
    for what, folder in expected_imports(tree).items():
        path = Path(got[what]).resolve()
        if (path if what in ("kernels", "models") else path.parent) != folder:
            raise RuntimeError(f"{tree}: a child process there imports {what} from {got[what]}, not from {folder}")


def env_setting(text: str) -> Tuple[str, str]:
    """'NAME=VALUE' of --env -> (NAME, VALUE); UsageError otherwise."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise UsageError(f"--env {text!r}: give NAME=VALUE")
    return name, value


def bench(tree: Path, args: argparse.Namespace, out: Path, env: Sequence[Tuple[str, str]] = ()) -> Dict[int, float]:
    """One fresh `python -m tools.bench_unet --no-torch` in `tree` (its rows to the JSON file `out`),
    with the environment settings `env` on top of this process's: {batch: graph ms}."""
    cmd = [sys.executable, "-m", "tools.bench_unet", "--no-torch", "--batches", args.batches, "--precisions",
           args.precision, "--iters", str(args.iters), "--repeats", str(args.repeats), "--json", str(out)]
    if getattr(args, "sms", None):
        cmd += ["--sms", str(args.sms)]   # on a slice of that many SMs (bench_unet --sms)
    if getattr(args, "per_op", 0):
        cmd += ["--per-op", "1"]   # every launch timed alone; per_op_rows reads them from `out`
    shards = getattr(args, "shards", None) or build_shards()   # the copies have no cubins: compile side by side
    cmd += ["--shards", str(shards)]
    r = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env={**os.environ, **dict(env)})
    if r.returncode != 0:
        raise RuntimeError(f"{tree}: bench_unet failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return {row["batch"]: row["graph_ms"] for row in json.loads(out.read_text())}


def per_op_rows(out: Path) -> Dict[int, Dict[str, float]]:
    """{batch: {op: us}} of the launches timed alone, from bench()'s JSON rows."""
    return {row["batch"]: row["per_op_us"] for row in json.loads(out.read_text())}


def per_op_summary(ops: Dict[str, List[Dict[int, Dict[str, float]]]], base: str, top: int) -> List[str]:
    """Per batch: each op's median us alone in `base` and each variant's median saving on it, the
    `top` slowest ops of `base`, then the sums over every op."""
    names = list(ops)
    lines = []
    for b in sorted(ops[base][0]):
        med = {n: {op: statistics.median(r[b][op] for r in ops[n]) for op in ops[n][0][b]} for n in names}
        lines.append(f"\nbatch {b}, launches timed alone: us in {base}, and what each variant saves")
        lines.append(f"{'op':28s} {base[:12]:>12s} " + " ".join(f"{n[:12]:>12s}" for n in names[1:]))
        order = sorted(med[base], key=lambda op: -med[base][op])
        for op in order[:top]:
            lines.append(f"{op:28s} {med[base][op]:12.1f} "
                         + " ".join(f"{med[base][op] - med[n].get(op, float('nan')):12.1f}" for n in names[1:]))
        tot = {n: sum(med[n].values()) for n in names}
        lines.append(f"{'sum of ' + str(len(order)) + ' ops':28s} {tot[base]:12.1f} "
                     + " ".join(f"{tot[base] - tot[n]:12.1f}" for n in names[1:]))
    return lines


def summary(times: Dict[str, List[Dict[int, float]]], base: str) -> List[str]:
    """Table lines: per variant and batch the graph ms of each round, and the median difference to
    `base` in us (positive: the variant is faster)."""
    lines = [f"{'variant':24s} {'batch':>5s} {'graph ms per round':>28s} {'saves us':>9s}"]
    for name, rounds in times.items():
        for b in sorted(rounds[0]):
            ms = [r[b] for r in rounds]
            ref = statistics.median(r[b] for r in times[base])
            saves = "" if name == base else f"{1000 * (ref - statistics.median(ms)):9.1f}"
            lines.append(f"{name:24s} {b:5d} {' / '.join(f'{v:.3f}' for v in ms):>28s} {saves:>9s}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="*", help="knockouts (join with '+' for several in one copy)")
    ap.add_argument("--ref", action="append", default=[], metavar="REV",
                    help="also time the kernels of this git revision or folder (repeatable)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="also time the working tree with this environment setting (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the knockouts and exit")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--sms", type=int, default=None, metavar="N", help="run every variant on an N-SM slice")
    ap.add_argument("--rounds", type=int, default=2, help="turns each variant takes (default: 2)")
    ap.add_argument("--shards", type=int, default=None, metavar="N",
                    help="kernel modules each copy compiles side by side (default: one per core, as jetson-tune; "
                         "1 for a whole old --ref tree whose executor predates the split)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-op", type=int, default=0, metavar="N",
                    help="also time every launch alone in each variant and print the N slowest ops' savings")
    ap.add_argument("--keep", default="", help="build the copies here and keep them (default: a temp folder)")
    ap.add_argument("--json", default="", help="also write {variant: [{batch: ms}, ...]} here")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except UsageError as e:   # one line, exit 2, before any copy is made
        print(f"knockout: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name, (what, _) in KNOCKOUTS.items():
            print(f"{name:10s} removes {what}")
        return 0
    if not args.variants and not args.ref and not args.env:
        raise UsageError("name at least one knockout, --ref or --env (see --list)")
    if args.shards is not None and args.shards < 1:
        raise UsageError(f"--shards must be at least 1, got {args.shards}")
    envs = [env_setting(e) for e in args.env]
    for v in args.variants:
        patches(v)   # unknown names fail before any copy is made
    for rev in args.ref:
        ref_names(rev)   # so do unknown revisions
    work = Path(args.keep or tempfile.mkdtemp(prefix="knockout-")).absolute()   # the children run elsewhere
    work.mkdir(parents=True, exist_ok=True)
    try:
        base = make_tree(work / "base", "")   # a copy too: no shipped cubins (make_tree)
        trees: Dict[str, Tuple[Path, List[Tuple[str, str]]]] = {"working tree": (base, [])}
        for v in args.variants:
            trees[v] = (make_tree(work / v.replace("+", "_"), v), [])
        for rev in args.ref:
            trees[f"ref {rev}"] = (make_tree(work / ("ref_" + "".join(c if c.isalnum() else "_" for c in rev)), "", rev), [])
        for tree, _ in trees.values():
            check_tree(tree)   # each tree's own package (a copy's, not the installed one), or nothing is timed
        for text, setting in zip(args.env, envs):
            trees[f"env {text}"] = (base, [setting])
        times: Dict[str, List[Dict[int, float]]] = {name: [] for name in trees}
        ops: Dict[str, List[Dict[int, Dict[str, float]]]] = {name: [] for name in trees}
        for rnd in range(args.rounds):
            for name, (tree, env) in trees.items():
                times[name].append(bench(tree, args, work / "rows.json", env))
                if args.per_op:
                    ops[name].append(per_op_rows(work / "rows.json"))
                print(f"round {rnd + 1} {name}: " + ", ".join(f"b{b} {ms:.3f} ms" for b, ms in times[name][-1].items()),
                      flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(summary(times, "working tree")))
    if args.per_op:
        print("\n".join(per_op_summary(ops, "working tree", args.per_op)))
    if args.json:
        Path(args.json).write_text(json.dumps({k: [{str(b): ms for b, ms in r.items()} for r in v]
                                               for k, v in times.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
