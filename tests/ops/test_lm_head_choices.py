"""lm_head_logprobs' choices around its kernels: the pure-torch fallbacks (loud, and equal to the
spec), bad input refused with a ValueError naming the argument, and the CUDA and bf16 GEMM
switches. These do not depend on which bf16 GEMM is active, so unlike test_lm_head_logprobs.py
they run once, not once per GEMM."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch
from _lm_head_reference import DTYPES, assert_close_scaled, check_against_reference, make_inputs, reference

import orsd.ops
from orsd import _C
from orsd.ops import lm_head_logprobs

op_module = importlib.import_module("orsd.ops.lm_head_logprobs")
backend_module = importlib.import_module("orsd.ops._backend")


@pytest.fixture
def restore_gemm():
    previous = _C.lm_head_gemm()
    yield
    _C.set_lm_head_gemm(previous)


# ---- fallbacks ---------------------------------------------------------------------------------


def test_missing_extension_falls_back_loudly_and_matches(without_native):
    hidden, weight, targets = make_inputs(1100, 8, 60, torch.float32, "cpu")  # two fallback chunks
    with pytest.warns(RuntimeWarning, match="pure-torch reference"):
        lp, entropy = orsd.ops.lm_head_logprobs(hidden, weight, targets, temperature=0.9, return_entropy=True)
    ref_lp, ref_entropy, hidden64, weight64 = reference(hidden, weight, targets, 0.9)
    torch.testing.assert_close(lp.double(), ref_lp.detach(), atol=1e-4, rtol=1e-5)
    (lp.sum() + entropy.sum()).backward()
    (ref_lp.sum() + ref_entropy.sum()).backward()
    assert_close_scaled(hidden.grad, hidden64.grad, torch.float32, "grad_hidden (fallback)")
    assert_close_scaled(weight.grad, weight64.grad, torch.float32, "grad_weight (fallback)")


def test_extension_built_before_the_op_falls_back_loudly(monkeypatch):
    stale = types.SimpleNamespace(**{
        name: getattr(backend_module._C, name) for name in dir(backend_module._C) if not name.startswith("lm_head")
    })  # fmt: skip
    monkeypatch.setattr(backend_module, "_C", stale)
    monkeypatch.setattr(op_module, "_warned_fallback", False)
    hidden, weight, targets = make_inputs(6, 8, 40, torch.float32, "cpu")
    with pytest.warns(RuntimeWarning, match="rebuild"):
        lp = lm_head_logprobs(hidden, weight, targets)
    torch.testing.assert_close(lp.double(), reference(hidden, weight, targets)[0].detach(), atol=1e-4, rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        lm_head_logprobs(hidden, weight, targets)


def test_validation_still_runs_without_native(without_native):
    hidden, weight, _ = make_inputs(3, 8, 11, torch.float32, "cpu")
    with pytest.raises(ValueError, match="^targets"):
        lm_head_logprobs(hidden, weight, torch.tensor([1, 2, 11]))


# ---- bad input ---------------------------------------------------------------------------------


def good_args():
    hidden, weight, targets = make_inputs(4, 8, 10, torch.float32, "cpu")
    return {"hidden": hidden, "weight": weight, "targets": targets}


@pytest.mark.parametrize(
    "name, bad",
    [
        ("hidden", torch.zeros(4, 8, dtype=torch.float64)),
        ("hidden", torch.zeros(32)),
        ("hidden", torch.zeros(8, 4).T),
        ("hidden", torch.zeros(4, 0)),
        ("hidden", [[0.0] * 8] * 4),
        ("weight", torch.zeros(10, 8, dtype=torch.bfloat16)),  # dtype differs from hidden
        ("weight", torch.zeros(10, 7)),
        ("weight", torch.zeros(0, 8)),
        ("weight", torch.zeros(8, 10).T),
        ("targets", torch.zeros(3, dtype=torch.int64)),
        ("targets", torch.tensor([0, 1, 2, 10])),
        ("targets", torch.tensor([0, -1, 2, 3])),
        ("targets", torch.zeros(4, dtype=torch.int32)),
        ("targets", torch.zeros(4, 1, dtype=torch.int64)),
        ("temperature", 0),
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", True),
        ("softcap", -1.0),
        ("softcap", float("nan")),
        ("softcap", 1e-300),
        ("logit_scale", 0.0),
        ("logit_scale", float("inf")),
        ("logit_scale", 1e39),
        ("return_entropy", 1),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad):
    args = good_args()
    kwargs = {}
    if name in args:
        args[name] = bad
    else:
        kwargs[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}"):
        lm_head_logprobs(**args, **kwargs)


@pytest.mark.gpu
def test_device_mismatch_raises_value_error():
    hidden, weight, targets = make_inputs(4, 8, 10, torch.float32, "cpu")
    with pytest.raises(ValueError, match="^weight"):
        lm_head_logprobs(hidden, weight.detach().cuda(), targets)
    with pytest.raises(ValueError, match="^targets"):
        lm_head_logprobs(hidden, weight, targets.cuda())


# ---- the CUDA GEMM choice (cuBLAS from torch's library, or the module's own kernels) -----------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, H, V", [(1, 8, 1), (70, 33, 1031), (300, 64, 4097), (1100, 96, 9000)])
def test_both_cuda_gemms_match_the_reference(T, H, V, dtype):
    assert "cublas" in op_module.CUDA_GEMMS and op_module.cuda_gemm() == "cublas", "cuBLAS not found or failed its self-test"
    try:
        for name in op_module.CUDA_GEMMS:
            op_module.set_cuda_gemm(name)
            assert op_module.cuda_gemm() == name
            hidden, weight, targets = make_inputs(T, H, V, dtype, "cuda", scale=2.0)
            check_against_reference(hidden, weight, targets, temperature=0.9, softcap=4.0 if T == 70 else 0.0)
    finally:
        op_module.set_cuda_gemm("cublas")


def test_cuda_gemm_switch_refuses_unknown_names():
    before = op_module.cuda_gemm()
    with pytest.raises(ValueError, match=r"^cuda_gemm: 'mkl' is not one of cublas, own"):
        op_module.set_cuda_gemm("mkl")
    assert op_module.cuda_gemm() == before


def test_cuda_gemm_environment_variable_is_checked_at_import():
    env = {**os.environ, "ORSD_LM_HEAD_CUDA_GEMM": "cutlass"}
    result = subprocess.run([sys.executable, "-c", "import orsd.ops"], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "ValueError: ORSD_LM_HEAD_CUDA_GEMM: 'cutlass' is not one of cublas, own" in result.stderr
    env["ORSD_LM_HEAD_CUDA_GEMM"] = "own"
    code = "import importlib; print(importlib.import_module('orsd.ops.lm_head_logprobs')._cuda_gemm_choice)"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "own"  # fmt: skip


# ---- the bf16 GEMM choice ----------------------------------------------------------------------


def test_gemm_switch_refuses_unknown_names_and_keeps_its_choice():
    before = _C.lm_head_gemm()
    assert "mkl" in _C.lm_head_gemms_available() and before in _C.lm_head_gemms_available()
    with pytest.raises(ValueError, match=r"^lm_head_gemm: 'cublas' is not available .*expected one of: .*mkl"):
        _C.set_lm_head_gemm("cublas")
    assert _C.lm_head_gemm() == before


def test_first_choice_follows_the_cpu_and_the_environment_variable():
    # a fresh process each: the choice is made once, at the first call
    def first_choice(env_value):
        env = {k: v for k, v in os.environ.items() if k != "ORSD_LM_HEAD_GEMM"}
        if env_value is not None:
            env["ORSD_LM_HEAD_GEMM"] = env_value
        code = "from orsd import _C; print(_C.lm_head_gemm())"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    own = "own" in _C.lm_head_gemms_available()
    assert first_choice(None) == ("own" if own and "amx_bf16" not in flags else "mkl")
    assert first_choice("mkl") == "mkl"
    assert first_choice("own") == ("own" if own else first_choice(None))


@pytest.mark.skipif(len(_C.lm_head_gemms_available()) < 2, reason="one bf16 GEMM on this CPU (no AVX512-BF16)")
def test_both_gemms_agree_to_rounding(cpu_isa, restore_gemm):
    hidden, weight, targets = make_inputs(150, 64, 2500, torch.bfloat16, "cpu", scale=3.0)
    results = {}
    for name in ("own", "mkl"):
        _C.set_lm_head_gemm(name)
        hidden.grad = weight.grad = None
        lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
        (lp.sum() - 0.5 * entropy.sum()).backward()
        results[name] = (lp, entropy, hidden.grad.clone(), weight.grad.clone())
    for a, b, what in zip(results["own"], results["mkl"], ("lp", "entropy", "grad_hidden", "grad_weight")):
        # f32 sums in another order; the gradients are rounded to bf16 once (1 ulp of the largest)
        tol = 1e-5 if a.dtype == torch.float32 else 2 * 2 ** -8
        torch.testing.assert_close(a.double(), b.double(), atol=tol * a.abs().max().item(), rtol=0, msg=what)
