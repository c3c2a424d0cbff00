"""Lab tools for kernel work, apart from the product and not installed; run from the repo root as
`python -m tools.lab.<name>`: `knockout` (time the working tree against copies with parts of the
kernels removed, another revision's kernels or an environment setting), `gemm_ceiling` (our GEMM
convs against cuBLAS, cuDNN and Triton on the same shapes), `ncu_ops` (chosen launches inside an
NVTX range for Nsight Compute) and `roofline` (FLOP and byte floors of every op, measured against
this GPU, and the Orin Nano prediction).
"""
