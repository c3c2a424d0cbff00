"""Kernel instantiation keys: each names one template instantiation of kernels/*.cu (its symbol) and
the generated `extern "C"` line that makes it (jetson_unet.build.sources).
"""
from __future__ import annotations

from dataclasses import dataclass


DTYPES = {"fp32": ("F32", "f32"), "fp16": ("F16", "f16"), "bf16": ("BF16", "bf16")}
# The op features a GEMM-conv instantiation is compiled for, as letters of its symbol and bits of
# kernels/conv.cu CONV_FEATURE_ARGS (bit i: the i-th letter): what the op does not have is a
# compile-time null or constant there, so its code folds away. g: GELU; t: time bias; n: GroupNorm
# of the input; k: a second K segment (the residual's rows); r: a residual added in the epilogue;
# s: GroupNorm statistics of the output; p: split-K (splits > 1), which comes with every letter
# (ops.conv.with_features: the generic kernel); o: the output stored times a per-channel vector (the
# next conv's gn_w, where that conv folds its GroupNorm: ops.conv.output_scale).
FEATURES = "gtnkrspo"


@dataclass(frozen=True)
class ConvKey:
    """One instantiation of conv_gemm (kernels/conv.cu), or with stages > 0 of conv_gemm_pipe
    (kernels/conv_pipe.cu, a cp.async ring of `stages` k-tiles; the default for 16-bit convs with
    16-byte vectors), or with halo of conv_gemm_halo (kernels/conv_halo.cu: 3x3 stride 1, the input
    staged once per channel chunk as a halo tile, `stages` slots of weights in flight; with rows, its
    row-tile layout conv_gemm_halo_rows: BM = whole rows, a stage per 16-channel chunk). ks > 1 (the
    cp.async conv only): each warp tile shared by ks warps, each taking every ks-th k step."""
    dtype: str      # "fp32" | "fp16" | "bf16"
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    kh: int
    stride: int
    up: int
    vec: int
    gate: bool
    stages: int = 0   # 0: conv_gemm (register-staged double buffering)
    halo: bool = False
    rows: bool = False     # the halo conv's row tiles (kernels/conv_halo.cu conv_gemm_halo_rows; halo too)
    ks: int = 1       # k slices of the cp.async conv: KS warps per warp tile (kernels/conv_pipe.cu)
    nsplit: bool = False   # a gate whose N is split over CTAs (BN < N; kernels/conv.cu conv_finish)
    fold: bool = False     # GroupNorm folded into the GEMM (cp.async / halo convs; ops.fold_norm)
    feat: str = ""         # the op's features, letters of FEATURES in that order (ops.conv.with_features)

    def __post_init__(self) -> None:
        if self.feat != "".join(c for c in FEATURES if c in self.feat):
            raise ValueError(f"ConvKey feat {self.feat!r}: letters of {FEATURES!r}, in that order, once each")

    @property
    def symbol(self) -> str:
        kind = ("gaten" if self.nsplit else "gate") if self.gate else f"conv{self.kh}x{self.kh}s{self.stride}u{self.up}"
        return (f"{kind}_{DTYPES[self.dtype][1]}_{self.bm}x{self.bn}x{self.bk}_{self.wm}x{self.wn}_v{self.vec}"
                + (f"_{'r' if self.rows else 'h' if self.halo else 's'}{self.stages}" if self.stages else "")
                + (f"_k{self.ks}" if self.ks != 1 else "") + ("_f" if self.fold else "") + "_x" + (self.feat or "0"))

    @property
    def feat_bits(self) -> int:
        return sum(1 << FEATURES.index(c) for c in self.feat)

    @property
    def subpixel(self) -> bool:
        """An up2 3x3 conv as the cp.async conv's four sub-pixel 2x2 convs (kernels/conv_pipe.cu
        SubPixel; ops.conv.subpixel)."""
        return self.up == 2 and self.kh == 2

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn * self.ks

    def instance(self) -> str:
        if self.rows:
            return (f"CONV_HALO_ROWS_INSTANCE({self.symbol}, {DTYPES[self.dtype][0]}, {self.bm}, {self.bn}, "
                    f"{self.wm}, {self.wn}, {self.stages}, {int(self.fold)}, {self.feat_bits})")
        if self.halo:
            return (f"CONV_HALO_INSTANCE({self.symbol}, {DTYPES[self.dtype][0]}, {self.bm}, {self.bn}, {self.bk}, "
                    f"{self.wm}, {self.wn}, {self.up}, {self.stages}, {int(self.fold)}, {self.feat_bits})")
        macro, tail = (("CONV_PIPE_INSTANCE", f", {self.stages}, {self.ks}, {int(self.fold)}")
                       if self.stages else ("CONV_INSTANCE", ""))
        return (f"{macro}({self.symbol}, {DTYPES[self.dtype][0]}, {self.bm}, {self.bn}, {self.bk}, "
                f"{self.wm}, {self.wn}, {self.kh}, {self.stride}, {self.up}, {self.vec}, "
                f"{(2 if self.nsplit else 1) if self.gate else 0}{tail}, {self.feat_bits})")


def narrow_gate(g: int, r: int) -> bool:
    """kernels/gate.cu's gate_rows shapes: a warp holds all Cg columns (Cg <= 64) and the weights fit
    its CTA's smem (Cg + Cr <= 128); wider gates take gate_wide (ops.gate.rows_gate)."""
    return g <= 64 and g + r <= 128


@dataclass(frozen=True)
class SimpleKey:
    """dwconv / init_conv / init_conv_tc / final_conv / gate_rows instantiations: (kind, dtype, k, n, tw, cp)."""
    kind: str       # "dwconv" | "dwconv_tc" | "init" | "init_tc" | "final" | "gate_rows"
    dtype: str
    k: int = 0      # dwconv, init, init_tc: the kernel size; final: the output channels
    n: int = 1      # dwconv / final: elements per vector load; init, init_tc: input (image) channels;
                    # gate_rows: the gate's x (and output conv) channels
    tw: int = 8     # dwconv / init: the tile's width (ops.dwconv_tw, ops.init_tw); gate_rows: skip channels
    cp: int = 1     # dwconv: channels per thread (ops.dwconv_cp); dwconv_tc: per warp (ops.dwconv_tc_cpw);
                    # init_tc: output rows per warp (ops.io.init_tc_rows)
    th: int = 0     # dwconv: the tile's rows where not 8 cp (ops.dwconv_rows: 8-row pair tiles)

    @property
    def symbol(self) -> str:
        dt, w = DTYPES[self.dtype][1], (f"_w{self.tw}" if self.tw != 8 else "")
        return {"dwconv": f"dwconv{self.k}_{dt}_v{self.n}{w}" + (f"_p{self.cp}" if self.cp != 1 else "")
                + (f"_h{self.th}" if self.th else ""),
                "dwconv_tc": f"dwconv{self.k}_{dt}_tc{self.cp}",
                "init": f"init_conv{self.k}_c{self.n}_{dt}{w}",
                "init_tc": f"init_conv{self.k}_c{self.n}_{dt}_tc" + (f"_r{self.cp}" if self.cp != 1 else ""),
                "final": f"final_conv{self.k}_{dt}" + (f"_v{self.n}" if self.n != 1 else ""),
                "gate_rows": f"gate_rows_{dt}_g{self.n}_r{self.tw}"}[self.kind]

    def instance(self) -> str:
        d = DTYPES[self.dtype][0]
        if self.kind == "dwconv":
            return f"DW_INSTANCE({self.symbol}, {d}, {self.k}, {self.n}, {self.tw}, {self.cp}, {self.th or 8 * self.cp})"
        if self.kind == "dwconv_tc":
            return f"DW_TC_INSTANCE({self.symbol}, {d}, {self.k}, {self.cp})"
        if self.kind == "init":
            return f"INIT_INSTANCE({self.symbol}, {d}, {self.k}, {self.n}, {self.tw})"
        if self.kind == "init_tc":
            return f"INIT_TC_INSTANCE({self.symbol}, {d}, {self.k}, {self.n}, {self.cp})"
        if self.kind == "gate_rows":   # gate.cu: gate_rows for the narrow gates, else gate_wide
            macro = "GATE_ROWS_INSTANCE" if narrow_gate(self.n, self.tw) else "GATE_WIDE_INSTANCE"
            return f"{macro}({self.symbol}, {d}, {self.n}, {self.tw})"
        return f"FINAL_INSTANCE({self.symbol}, {d}, {self.n}, {self.k})"
