"""self_check: the real ops pass on CPU (and on CUDA where present), and a wrong op, a crashing op
or a wrong output type is reported as a failure naming the case, not as a pass or a crash."""

from __future__ import annotations

import math

import pytest
import torch

import orsd.ops
from orsd.ops import SelfCheckError, self_check
from orsd.ops.selfcheck import OPS


def test_real_ops_pass_on_cpu():
    results = self_check("cpu")
    assert set(results) == set(OPS)
    for op, result in results.items():
        assert result["ok"], (op, result)
        # lm_head_logprobs compares bf16 gradients too (docs/ops.md: within 1.5e-2 of the largest)
        assert result["max_error"] < (3e-2 if op == "lm_head_logprobs" else 1e-3), (op, result)
        assert "native kernels" in result["detail"] or "reference" in result["detail"]


@pytest.mark.gpu
def test_real_ops_pass_on_cuda():
    for op, result in self_check("cuda").items():
        assert result["ok"], (op, result)


def test_a_slightly_wrong_op_is_reported_with_its_case():
    def off_by_a_bit(*args, **kwargs):
        lp, lse = orsd.ops.token_logprobs(*args, **kwargs)
        return lp + 1e-3 * (lp != 0), lse  # 10x the tolerance on every unmasked row

    results = self_check("cpu", {"token_logprobs": off_by_a_bit})
    assert list(results) == ["token_logprobs"]
    result = results["token_logprobs"]
    assert not result["ok"]
    assert 5e-4 < result["max_error"] < 1e-2
    assert "case float32 T=5 V=1" not in result["detail"]  # V = 1: lp is exactly 0, not shifted
    assert "output 0" in result["detail"] and "tolerance" in result["detail"]


def test_a_bitwise_op_off_by_one_ulp_fails():
    def one_ulp_off(*args, **kwargs):
        weights = orsd.ops.microbatch_weights(*args, **kwargs)
        return torch.nextafter(weights, torch.ones_like(weights))

    result = self_check("cpu", {"microbatch_weights": one_ulp_off})["microbatch_weights"]
    assert not result["ok"] and result["max_error"] > 0


def test_nan_pattern_exception_and_wrong_type_are_failures():
    def hides_nan(**kwargs):  # e.g. a kernel that forgets the "row max not finite" branch
        lp, lse = orsd.ops.token_logprobs(**kwargs)
        return lp.nan_to_num(0.0), lse

    def raises(**kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def returns_a_list(**kwargs):
        return orsd.ops.grpo_advantages(**kwargs).tolist()

    results = self_check(
        "cpu", {"token_logprobs": hides_nan, "splice_rubric": raises, "grpo_advantages": returns_a_list}
    )
    assert all(not r["ok"] for r in results.values()), results
    assert "NaN mismatch" in results["token_logprobs"]["detail"]
    assert "illegal memory access" in results["splice_rubric"]["detail"]
    assert math.isinf(results["splice_rubric"]["max_error"])
    assert "expected a tensor" in results["grpo_advantages"]["detail"]


def test_strict_raises_with_the_report():
    def zeros(**kwargs):
        return torch.zeros_like(orsd.ops.grpo_advantages(**kwargs))

    with pytest.raises(SelfCheckError, match="grpo_advantages") as raised:
        self_check("cpu", {"grpo_advantages": zeros}, strict=True)
    assert raised.value.results["grpo_advantages"]["ok"] is False
    assert self_check("cpu", ["splice_rubric"], strict=True)["splice_rubric"]["ok"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="^ops"):
        self_check("cpu", ["token_logprob"])
    with pytest.raises(ValueError, match="^device"):
        self_check("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="^device"):
            self_check("cuda")


def test_a_wrong_lm_head_gradient_is_caught_though_the_values_are_right():
    def gradient_half_again(hidden, weight, targets, **kwargs):
        # the same values, 1.5 x the gradient into hidden
        return orsd.ops.lm_head_logprobs(hidden * 1.5 - hidden.detach() * 0.5, weight, targets, **kwargs)

    result = self_check("cpu", {"lm_head_logprobs": gradient_half_again})["lm_head_logprobs"]
    assert not result["ok"]
    assert "output 2" in result["detail"]  # grad_hidden; outputs 0 and 1 (lp, entropy) matched
