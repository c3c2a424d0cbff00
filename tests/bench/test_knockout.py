"""tools.lab.knockout without a GPU: every knockout still applies to the current kernels (its texts
occur exactly once: a kernel edit that moves one fails here, not on the device), a copy imports its
own package, a revision's kernels come out of git, the table's differences, and the usage errors."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tools.lab.knockout as K
from jetson_unet.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(K.KNOCKOUTS))
def test_every_knockout_applies_once_to_the_current_kernels(tmp_path, name):
    kernels = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", kernels)
    K.apply(kernels, K.patches(name))
    changed = [f.name for f in sorted(kernels.glob("*")) if f.is_file()
               and f.read_bytes() != (ROOT / "kernels" / f.name).read_bytes()]
    assert changed == sorted({p[0] for p in K.KNOCKOUTS[name][1]})


def test_a_text_not_found_once_is_a_usage_error(tmp_path):
    (tmp_path / "conv.cu").write_text("a; a;")
    with pytest.raises(UsageError, match="occurs 2 times"):
        K.apply(tmp_path, [("conv.cu", "a;", "b;")])
    with pytest.raises(UsageError, match="occurs 0 times"):
        K.apply(tmp_path, [("conv.cu", "c;", "b;")])


def test_variants_join_with_plus_and_unknown_names_fail():
    assert K.patches("gelu+stats") == K.KNOCKOUTS["gelu"][1] + K.KNOCKOUTS["stats"][1]
    with pytest.raises(UsageError, match="no knockout named 'nope'"):
        K.patches("gelu+nope")


def test_make_tree_copies_the_package_and_patches_only_the_copy(tmp_path):
    tree = K.make_tree(tmp_path / "t", "kloop")
    assert (tree / "tools" / "bench_unet.py").is_file() and (tree / "jetson_unet" / "ops" / "conv.py").is_file()
    assert (tree / "jetson_unet" / "models" / "__init__.py").is_file()
    assert "ntiles = 0 * (ke - kb);" in (tree / "jetson_unet" / "kernels" / "conv_pipe.cu").read_text()
    assert "ntiles = 0 * (ke - kb);" not in (ROOT / "kernels" / "conv_pipe.cu").read_text()
    # no shipped cubin in the copy: every variant runs this machine's compiler's code
    assert (tree / "jetson_unet" / "cubins" / "__init__.py").is_file()
    assert not [f for f in (tree / "jetson_unet" / "cubins").iterdir() if f.suffix in (".cubin", ".json")]
    assert list((ROOT / "runtime" / "cubins").glob("*.cubin"))


def test_a_child_process_in_the_copy_imports_the_copy_not_the_installed_package(tmp_path):
    tree = K.make_tree(tmp_path / "t", "gelu")
    got = K.child_imports(tree)
    assert Path(got["package"]).parent == (tree / "jetson_unet").resolve()
    assert Path(got["kernels"]) == (tree / "jetson_unet" / "kernels").resolve()
    assert Path(got["tools"]).parent == (tree / "tools").resolve()
    K.check_tree(tree)
    shutil.rmtree(tree / "jetson_unet")   # a tree without its own package would time the installed one
    with pytest.raises(RuntimeError, match="imports package from"):
        K.check_tree(tree)


def test_ref_kernels_come_from_git(tmp_path):
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                                     capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    K.ref_kernels("HEAD", tmp_path)
    want = subprocess.run(["git", "show", "HEAD:kernels/conv.cu"], cwd=ROOT, capture_output=True, check=True).stdout
    assert (tmp_path / "conv.cu").read_bytes() == want
    with pytest.raises(UsageError, match="--ref no-such-rev"):
        K.ref_kernels("no-such-rev", tmp_path)


def test_ref_kernels_come_from_a_folder(tmp_path):
    """A lent machine's copy of the repo has no git history: --ref takes a folder of kernel files."""
    src, dest = tmp_path / "kbase", tmp_path / "dest"
    src.mkdir(); dest.mkdir()
    (src / "conv.cu").write_text("// old conv\n")
    (dest / "conv.cu").write_text("// new conv\n")
    (dest / "io.cu").write_text("// io\n")
    K.ref_kernels(str(src), dest)
    assert (dest / "conv.cu").read_text() == "// old conv\n" and (dest / "io.cu").read_text() == "// io\n"
    (src / "conv.cu").unlink()
    (src / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="without kernel files"):
        K.ref_names(str(src))


def test_a_whole_tree_ref_brings_its_package_and_its_kernels(tmp_path):
    """A kernel change that moves the launchers too is timed against a whole tree: runtime/ + kernels/."""
    old = tmp_path / "old"
    shutil.copytree(ROOT / "runtime", old / "runtime", ignore=K._skip)
    shutil.copytree(ROOT / "kernels", old / "kernels")
    (old / "runtime" / "ops" / "dwconv.py").write_text((old / "runtime" / "ops" / "dwconv.py").read_text() + "# old\n")
    (old / "kernels" / "dwconv.cu").write_text("// old dwconv\n")
    assert K.whole_tree(str(old)) and not K.whole_tree(str(old / "kernels"))
    assert any(n.endswith("dwconv.cu") for n in K.ref_names(str(old)))
    tree = K.make_tree(tmp_path / "t", "", str(old))
    assert (tree / "jetson_unet" / "ops" / "dwconv.py").read_text().endswith("# old\n")
    assert (tree / "jetson_unet" / "kernels" / "dwconv.cu").read_text() == "// old dwconv\n"
    assert (tree / "jetson_unet" / "kernels" / "conv.cu").read_bytes() == (ROOT / "kernels" / "conv.cu").read_bytes()
    assert (tree / "tools" / "bench_unet.py").read_bytes() == (ROOT / "tools" / "bench_unet.py").read_bytes()


def test_summary_gives_each_variant_its_median_saving_against_the_base():
    times = {"working tree": [{1: 0.395, 16: 1.034}, {1: 0.395, 16: 1.030}],
             "gelu": [{1: 0.384, 16: 0.984}, {1: 0.384, 16: 0.985}]}
    lines = K.summary(times, "working tree")
    gelu16 = next(line for line in lines if line.startswith("gelu") and " 16 " in line)
    assert "0.984 / 0.985" in gelu16 and gelu16.split()[-1] == "47.5"
    base1 = next(line for line in lines if line.startswith("working tree") and " 1 " in line)
    assert base1.rstrip().endswith("0.395 / 0.395")


def test_cli_usage_errors_exit_2_with_one_line():
    in_git = shutil.which("git") is not None and subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                                                capture_output=True).returncode == 0
    bad = ([], ["nope"], ["--env", "NOEQUALS"], ["gelu", "--shards", "0"])
    for argv in bad + ((["gelu", "--ref", "no-such-rev"],) if in_git else ()):
        r = subprocess.run([sys.executable, "-m", "tools.lab.knockout", *argv], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.startswith("knockout: ") and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "tools.lab.knockout", "--list"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and all(name in r.stdout for name in K.KNOCKOUTS)


def test_main_alternates_the_variants_and_cleans_up(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_bench(tree, args, out, env=()):
        calls.append(tree)
        assert out.parent.is_dir()
        return {1: 0.300 if "gelu" in str(tree) else 0.310, 16: 1.0}

    monkeypatch.setattr(K, "bench", fake_bench)
    monkeypatch.setattr(K, "check_tree", lambda tree: None)   # no child processes: bench is faked
    made = []
    monkeypatch.setattr(K.tempfile, "mkdtemp", lambda prefix: str(made.append(tmp_path / "w") or made[0]))
    assert K.main(["gelu", "--rounds", "2", "--json", str(tmp_path / "t.json")]) == 0
    assert [c.name for c in calls] == ["base", "gelu", "base", "gelu"]   # the copies take turns
    out = capsys.readouterr().out
    assert "gelu" in out.splitlines()[-2] and out.splitlines()[-2].split()[-1] == "10.0"
    assert '"gelu"' in (tmp_path / "t.json").read_text()
    assert not (tmp_path / "w").exists()   # the copies are removed without --keep


def test_env_variants_run_the_working_tree_with_the_setting(tmp_path, monkeypatch, capsys):
    """--env NAME=VALUE: the working tree again, its bench rows with that setting (an opt-in's A/B)."""
    calls = []

    def fake_bench(tree, args, out, env=()):
        calls.append((tree, list(env)))
        return {1: 0.290 if env else 0.300, 16: 1.0}

    monkeypatch.setattr(K, "bench", fake_bench)
    monkeypatch.setattr(K, "check_tree", lambda tree: None)   # no child processes: bench is faked
    monkeypatch.setattr(K.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "w"))
    assert K.main(["--env", "JETSON_UNET_TILES=old-tiles", "--rounds", "2"]) == 0
    base = tmp_path / "w" / "base"   # the working tree's copy, without the shipped cubins
    assert calls == [(base, []), (base, [("JETSON_UNET_TILES", "old-tiles")])] * 2
    last = capsys.readouterr().out.splitlines()
    row = next(line for line in last if line.startswith("env JETSON_UNET_TILES=old-tiles") and " 1 " in line)
    assert row.split()[-1] == "10.0"


def test_per_op_summary_gives_each_ops_median_saving_and_the_sums():
    ops = {"working tree": [{16: {"a": 10.0, "b": 4.0}}, {16: {"a": 12.0, "b": 4.0}}],
           "kloop": [{16: {"a": 5.0, "b": 3.0}}, {16: {"a": 5.0, "b": 3.0}}]}
    lines = K.per_op_summary(ops, "working tree", top=1)
    assert any(line.startswith("batch 16") for line in [x.strip() for x in lines])
    row_a = next(line for line in lines if line.startswith("a "))
    assert row_a.split()[1:] == ["11.0", "6.0"]               # median 11 alone; kloop saves 6
    assert not any(line.startswith("b ") for line in lines)   # only the top 1
    total = next(line for line in lines if line.startswith("sum of 2 ops"))
    assert total.split()[-2:] == ["15.0", "7.0"]


def test_main_per_op_reads_every_rounds_launch_times(tmp_path, monkeypatch, capsys):
    def fake_bench(tree, args, out, env=()):
        assert args.per_op == 5
        fast = "kloop" in str(tree)
        out.write_text(json.dumps([{"batch": 16, "graph_ms": 0.5, "per_op_us": {"conv": 3.0 if fast else 9.0}}]))
        return {16: 0.5}

    monkeypatch.setattr(K, "bench", fake_bench)
    monkeypatch.setattr(K, "check_tree", lambda tree: None)   # no child processes: bench is faked
    monkeypatch.setattr(K.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "w"))
    assert K.main(["kloop", "--batches", "16", "--per-op", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert next(line for line in out if line.startswith("conv ")).split()[1:] == ["9.0", "6.0"]


def test_bench_passes_the_slice_to_bench_unet(tmp_path, monkeypatch):
    """--sms N: every variant's bench_unet runs on an N-SM slice; without it, on the whole GPU. Either
    way its kernels build in jetson-tune's shards (tune.build_shards)."""
    cmds = []

    def fake_run(cmd, **kw):
        cmds.append(cmd)
        (tmp_path / "o.json").write_text(json.dumps([{"batch": 4, "graph_ms": 2.5}]))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(K.subprocess, "run", fake_run)
    monkeypatch.setattr(K, "build_shards", lambda: 3)
    for sms in (8, None):
        args = K.argparse.Namespace(batches="4", precision="fp16", iters=10, repeats=1, per_op=0, sms=sms)
        assert K.bench(tmp_path, args, tmp_path / "o.json") == {4: 2.5}
    assert cmds[0][cmds[0].index("--sms") + 1] == "8"
    assert "--sms" not in cmds[1]
    assert all(c[c.index("--shards") + 1] == "3" for c in cmds)   # the copies compile side by side
    args = K.argparse.Namespace(batches="4", precision="fp16", iters=10, repeats=1, per_op=0, sms=None, shards=1)
    K.bench(tmp_path, args, tmp_path / "o.json")
    assert cmds[-1][cmds[-1].index("--shards") + 1] == "1"   # --shards 1: an old tree's executor
