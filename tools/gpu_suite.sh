#!/usr/bin/env bash
# The whole GPU suite and the benchmarks in one command, for a GPU machine (the lent H100/H200, a
# Jetson, a workstation), run from the repo root with jetson_unet installed (pip install -e .).
# Every step has its own time limit; all output goes to one log under $OUT (default out/gpu-suite)
# plus the JSON/PNG results, so a cut-off run still reports.
#   OUT=/tmp/x bash tools/gpu_suite.sh            # everything
#   QUICK=1 bash tools/gpu_suite.sh               # tests only (gpu-tests, tile-variants, tile-deep, jetson-archs)
#   STEPS="gpu-tests jetson-archs" bash tools/gpu_suite.sh   # the named steps only
#   STEPS=tune bash tools/gpu_suite.sh            # opt-in: jetson-tune's files for this GPU into $OUT/tiles
# Cold on an H100 the GPU tests took ~520 s: ~270 s without the tile variants, ~250 s for them
# (every halo / k-sliced tile the tuner may pick, op by op); on a cold H200 gpu-tests alone passed
# 450 s at 43 of 65 tests (NVRTC builds; 96 s warm). Under a 10-minute limit per command (the lent
# machines), run STEPS=gpu-tests, STEPS=tile-variants, STEPS=tile-deep (the cp.async conv with its
# ring in dynamic smem), then STEPS="jetson-archs pycuda-tests". On a cold H100 tile-variants'
# op-by-op half took 360 s.
set -u
OUT=${OUT:-out/gpu-suite}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then   # wheels carried to a machine without a network (pycuda)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
LOG="$OUT/all.log"
if [ -n "${QUICK:-}" ]; then STEPS=${STEPS:-gpu-tests tile-variants tile-deep jetson-archs}; fi
STEPS=${STEPS:-gpu-tests tile-variants tile-deep jetson-archs sample bench-sampling jetson-bench pycuda-tests roofline}
step() {
  local name=$1 limit=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  echo "=== $name ($(date +%T), limit ${limit}s): $*" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "=== rc=$? $name" | tee -a "$LOG"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv >>"$LOG" 2>&1
step gpu-tests 580 env GPU_REPORT="$OUT/gpu-report.txt" python3 -m pytest -m gpu tests/gpu -q -rs \
  --ignore=tests/gpu/test_gpu_pycuda.py --ignore=tests/gpu/test_gpu_tile_variants.py
step gpu-faults 240 python3 -m pytest -m gpu tests/gpu/test_gpu_faults.py -q -rs
step tile-variants 580 env GPU_REPORT="$OUT/gpu-report-tiles.txt" python3 -m pytest -m gpu \
  tests/gpu/test_gpu_tile_variants.py -q -rs -k "not deep"
step tile-deep 480 env GPU_REPORT="$OUT/gpu-report-tiles-deep.txt" python3 -m pytest -m gpu \
  tests/gpu/test_gpu_tile_variants.py -q -rs -k deep
# The Jetson archs from this machine: the shipped model's modules built for sm_87 (nvcc, SASS arch
# checked) and for sm_72 through a CUDA 11/12 NVRTC (skips unless $JETSON_UNET_NVRTC or
# nvidia-cuda-nvrtc-cu11/12 is there: carry its wheel in .whl/), so nothing Hopper-only is in them
step jetson-archs 180 python3 -m pytest tests/host/test_nvrtc_lib.py tests/host/test_aot_prepare.py -q -rs -p no:cacheprovider
step sample 60 python3 -m jetson_unet.cli --backend cupy --batch 16 --seed 0 --out "$OUT/gpu-samples.png" \
  --trace "$OUT/trace.json" --quiet
# the command of the 100-step figures (docs/performance.md); cold (torch.compile of both peers) it passed 200 s
step bench-sampling 420 python3 -m tools.bench_sampling --batch 1 16 --repeat 3 --noise device --json "$OUT/bench_sampling.json"
step jetson-bench 90 python3 -m jetson_unet.bench.runner --backend cupy --batch 1 16 --precision fp16 --mode gpu cpu \
  --runs 3 --warmup 1 --telemetry auto --interval 0.05 --cold none --out "$OUT/jbench"
step pycuda-tests 360 python3 -m pytest -m gpu tests/gpu/test_gpu_pycuda.py -q -rs
step roofline 80 python3 -m tools.lab.roofline --json "$OUT/roofline.json"
# opt-in (STEPS=tune): the tuner (the console script jetson-tune) writes this GPU's tuning files to $OUT/tiles
step tune 580 python3 -m jetson_unet.tune --precision fp16 --batch 1 16 --out-dir "$OUT/tiles" --json "$OUT/tune.json"
# at most 8 files come back from the lent machine: fold the bench folder into one archive
[ -d "$OUT/jbench" ] && tar czf "$OUT/jbench.tgz" -C "$OUT" jbench && rm -rf "$OUT/jbench"
grep -E "^=== rc=|passed|failed|error" "$LOG" | tail -n 20
