"""Developer tools of the repository, not part of the installed `jetson_unet` package: each is run from
the repo root as `python -m tools.<name>` (those that compare with PyTorch need the `train` extra).
`train` trains seed-unet with PyTorch on the twin in `torch_unet`; `make_dataset` renders the emoji
training set; `make_parity_fixture` writes the torch-vs-reference parity fixture; `precision_psnr`
compares whole images across precisions through the Pipeline; `bench_unet` times one U-Net call
(ours and the torch peers); `bench_sampling` times whole 100-step images; `bench_peers` runs ours
against the PyTorch peers (`peers`) with an agreement check; `gpu_suite.sh` runs the GPU tests and
benchmarks on a GPU machine. The lab tools for kernel work live in `tools.lab`: `knockout` (A/B of
kernel changes and knockouts), `gemm_ceiling` (the convs against cuBLAS, cuDNN and Triton GEMMs),
`ncu_ops` (chosen launches for Nsight Compute) and `roofline` (the floors and the Orin prediction).
The tuner ships with the package: `jetson-tune` (`python -m jetson_unet.tune`).
"""
