"""tools.lab.sass_loops on the host: nvdisasm's text split into kernels, the loops that hold an mma and
their counts, the report, and the usage errors (the real compiler and nvdisasm in the slow test)."""
from __future__ import annotations

import pytest

from tools.lab import sass_loops

SASS = """
//--------------------- .text.k_other     --------------------------
        /*0000*/                   MOV R1, c[0x0][0x28] ;
//--------------------- .text.k_conv --------------------------
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDGSTS.E.BYPASS.128 [R4], [R6.64] ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0030*/                   LDL R2, [R1] ;
.L_x_2:
        /*0040*/                   LDSM.16.M88.4 R8, [R12] ;
        /*0050*/                   HMMA.16816.F32 R16, R8, R10, R16 ;
        /*0060*/                   HMMA.16816.F32 R20, R8, R11, R20 ;
        /*0070*/               @P0 BRA `(.L_x_2) ;
        /*0080*/                   STL [R1], R2 ;
        /*0090*/               @P1 BRA `(.L_x_1) ;
.L_x_3:
        /*00a0*/                   FADD R0, R0, R1 ;
        /*00b0*/               @P2 BRA `(.L_x_3) ;
        /*00c0*/                   EXIT ;
.L_x_4:
        /*00d0*/                   SHFL.BFLY PT, R3, R2, 0x1, 0x1f ;
        /*00e0*/                   BRA `(.L_x_2) ;
"""


def test_functions_split_the_text_by_kernel():
    """nvdisasm pads short kernel names with spaces before the dashes: those kernels count too."""
    fns = sass_loops.functions(SASS)
    assert sorted(fns) == ["k_conv", "k_other"]
    assert sum(1 for x in fns["k_conv"] if "/*" in x) == 15 and fns["k_conv"][1] == ".L_x_1:"


def test_mma_loops_are_the_loops_that_hold_an_hmma_outermost_first():
    loops = sass_loops.mma_loops(sass_loops.functions(SASS)["k_conv"])
    assert [(r["instructions"], r["hmma"], r["ldsm"], r["ldgsts"], r["bar"], r["local"]) for r in loops] == [
        (9, 2, 1, 1, 1, 2), (4, 2, 1, 0, 0, 0)]   # the FADD loop holds no mma; the stub after EXIT is none


def test_report_rows_per_matching_kernel_and_their_lines():
    rows = sass_loops.report(sass_loops.functions(SASS), ["conv"])
    assert [(r["kernel"], r["loop"]) for r in rows] == [("k_conv", "whole"), ("k_conv", "loop 1"), ("k_conv", "loop 2")]
    assert rows[0]["instructions"] == 15 and rows[0]["hmma"] == 2
    lines = sass_loops.lines_of(rows)
    assert len(lines) == 4 and lines[2].split() == ["k_conv", "loop", "1", "9", "2", "1", "1", "1", "2"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sass_loops: ")
    return err[0]


def test_a_missing_cubin_or_bad_target_exits_2(tmp_path, capsys):
    assert sass_loops.main(["--kernels", "x", "--cubin", str(tmp_path / "none.cubin")]) == 2
    assert "no such file" in _one_line(capsys)
    assert sass_loops.main(["--kernels", "x", "--arch", "60"]) == 2
    assert "--arch" in _one_line(capsys)


def test_no_nvdisasm_exits_2_and_says_how_to_get_one(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NVDISASM", raising=False)
    monkeypatch.setattr("jetson_unet.build.compilers.find_nvcc", lambda *a, **k: None)
    monkeypatch.setattr(sass_loops.Path, "glob", lambda self, pattern: iter(()))
    cub = tmp_path / "m.cubin"
    cub.write_bytes(b"\x7fELF")
    assert sass_loops.main(["--kernels", "x", "--cubin", str(cub)]) == 2
    assert "nvidia-cuda-nvdisasm" in _one_line(capsys)
    assert sass_loops.main(["--kernels", "x", "--cubin", str(cub), "--nvdisasm", str(tmp_path / "nope")]) == 2
    assert "not an executable" in _one_line(capsys)


def test_no_matching_kernel_exits_2_and_rows_go_to_json(monkeypatch, capsys, tmp_path):
    cub = tmp_path / "m.cubin"
    cub.write_bytes(b"\x7fELF")
    monkeypatch.setattr(sass_loops, "find_nvdisasm", lambda given=None: "nvdisasm")
    monkeypatch.setattr(sass_loops, "disassemble", lambda cubin, tool: SASS)
    assert sass_loops.main(["--kernels", "gemm", "--cubin", str(cub)]) == 2
    assert "no kernel matches gemm" in _one_line(capsys)
    out = tmp_path / "rows.json"
    assert sass_loops.main(["--kernels", "conv", "--cubin", str(cub), "--json", str(out)]) == 0
    assert "k_conv" in capsys.readouterr().out and out.read_text().count('"kernel"') == 3


@pytest.mark.slow
def test_the_shipped_models_row_tiles_have_an_mma_loop_in_a_chunk_loop():
    """Where nvcc (or NVRTC) and nvdisasm exist: the sm_87 8-SM module's 256 x 64 row tile has a
    three-barrier-free inner loop of 48 HMMA inside a chunk loop with one barrier."""
    from jetson_unet.build.compilers import find_nvcc
    try:
        tool = sass_loops.find_nvdisasm()
    except Exception:
        pytest.skip("no nvdisasm")
    if find_nvcc() is None:
        pytest.skip("no nvcc")
    rows = sass_loops.report(sass_loops.functions(sass_loops.disassemble(sass_loops.build_cubin(87, 8), tool)),
                             ["256x64x16_4x2_v8_r2_f_xgnso"])
    inner = [r for r in rows if r["loop"] != "whole" and r["bar"] == 0]
    chunk = [r for r in rows if r["loop"] != "whole" and r["bar"] == 1]
    assert inner and inner[-1]["hmma"] == 48 and chunk and chunk[-1]["ldgsts"] > 0
