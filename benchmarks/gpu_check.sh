#!/usr/bin/env bash
# One-shot GPU check for orsd's CUDA kernels, < 8 minutes on one H200, most telling first (a lease
# that runs out still returns the first steps):
#   1. lm_head_logprobs against the f64 reference with each CUDA GEMM, no sanitizer (seconds),
#   2. lm_head_logprobs forward + backward benchmark against torch's chunked and full-logits paths
#      and, when the cut-cross-entropy package is importable, Apple's CCE,
#   3. the gpu-marked tests (every op against its torch reference on the device),
#   4. compute-sanitizer memcheck and racecheck over drivers that run every kernel on awkward
#      shapes (benchmarks/gpu_sanitize.py; lm_head_logprobs: gpu_sanitize_lm_head_logprobs.py),
#   5. the other GPU benchmarks (T up to 32,768), as JSON and a markdown table,
#   6. one update micro-batch's memory by component (benchmarks/update_memory.py).
# Results go to benchmarks/results/gpu/ (override with ORSD_GPU_RESULTS). Needs orsd installed
# with CUDA kernels (pip install -e . on a machine with nvcc) and a CUDA build of torch.
# Exit status: 0 when every step passed; the first failing step's status otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${ORSD_GPU_RESULTS:-benchmarks/results/gpu}
PY=${PYTHON:-python}
mkdir -p "$OUT"
status=0
step() {  # step NAME TIMEOUT_SECONDS COMMAND...: run, log to $OUT/NAME.log, remember a failure
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

: >"$OUT/summary.txt"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PY" -c 'import torch, orsd.ops as o; print("torch", torch.__version__, "cuda", torch.version.cuda); print(o.backend())'
} >"$OUT/environment.txt" 2>&1
if ! "$PY" -c 'import orsd.ops as o, sys; sys.exit(o.backend()["cuda"] != "native")'; then
  echo "orsd has no usable CUDA kernels here; see $OUT/environment.txt" | tee -a "$OUT/summary.txt"
  exit 2
fi


step lm_head_smoke 60 "$PY" benchmarks/gpu_sanitize_lm_head_logprobs.py
# lm_head_logprobs: a training step (forward + backward) at T = 512 ... 32,768, H = 2,048,
# V = 151,936 against torch's chunked (checkpointed) and full-logits paths and CCE; 5 rounds each.
step lm_head_benchmarks 240 "$PY" -m pytest benchmarks/bench_lm_head_logprobs.py -m gpu -q -p no:cacheprovider \
  --orsd-rounds 5 --benchmark-json="$OUT/lm_head_gpu.json" --orsd-table "$OUT/lm_head_gpu.md"
step gpu_tests 150 "$PY" -m pytest tests/ops -m gpu -q -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml"

SANITIZER=$(command -v compute-sanitizer || true)
for dir in "${CUDA_HOME:-}" /usr/local/cuda; do
  if [ -z "$SANITIZER" ] && [ -n "$dir" ] && [ -x "$dir/bin/compute-sanitizer" ]; then SANITIZER=$dir/bin/compute-sanitizer; fi
done
if [ -n "$SANITIZER" ]; then
  # No caching allocator: every tensor is its own allocation, so an overrun past it is caught.
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  step sanitizer_memcheck 120 "$SANITIZER" --tool memcheck --error-exitcode 1 "$PY" benchmarks/gpu_sanitize.py
  step sanitizer_racecheck 120 "$SANITIZER" --tool racecheck --error-exitcode 1 "$PY" benchmarks/gpu_sanitize.py
  step sanitizer_memcheck_lm_head 120 "$SANITIZER" --tool memcheck --error-exitcode 1 "$PY" benchmarks/gpu_sanitize_lm_head_logprobs.py
  # racecheck over our GEMM only: with cuBLAS it reports hazards inside cuBLAS's own split-K
  # kernels (nvjet_sm90_*_splitK, H200, CUDA 13.0), and narrowing it to our kernels
  # (--kernel-name kns=orsd) broke a cuBLAS kernel under the tool ("Internal Sanitizer Error").
  # The column kernels are the same with either GEMM; memcheck above covers both.
  step sanitizer_racecheck_lm_head 120 "$SANITIZER" --tool racecheck --error-exitcode 1 "$PY" benchmarks/gpu_sanitize_lm_head_logprobs.py --gemm own
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
else
  echo "sanitizer: compute-sanitizer not found (install the CUDA toolkit's sanitizer); step not run" | tee -a "$OUT/summary.txt"
  if [ "$status" -eq 0 ]; then status=3; fi
fi

# the op benchmarks only (the environment benchmarks need the env extras and no GPU)
step gpu_benchmarks 240 "$PY" -m pytest -m gpu -q -p no:cacheprovider \
  benchmarks/bench_{token_logprobs,fused_token_logprobs,grpo_advantages,splice_rubric,shape_advantages,microbatch_weights}.py \
  --benchmark-json="$OUT/gpu_benchmarks.json" --orsd-table "$OUT/gpu_benchmarks.md"

# one update micro-batch at the paper's WebShop shape (Qwen3-1.7B shape, 2 layers): memory by component,
# chunked torch vs fused LM head (writes benchmarks/results/update_memory_cuda.{json,md})
step update_memory 120 "$PY" benchmarks/update_memory.py --device cuda --tokens 30720 --response 29696

echo "overall exit $status" | tee -a "$OUT/summary.txt"
exit "$status"
