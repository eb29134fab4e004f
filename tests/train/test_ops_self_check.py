"""The run's self-check of the native ops (orsd.train.build.check_ops), forced on CPU to compare a
deliberately wrong op: "error" stops the run, "fallback" routes ops to the reference, loudly."""

import pytest
import torch

from orsd import ops
from orsd.ops import _backend, reference
from orsd.train.build import check_ops


def wrong_grpo_advantages(rewards, group_ids, eps=1e-6, norm_by_std=True):
    return ops.grpo_advantages(rewards, group_ids, eps, norm_by_std) + 0.5  # a broken kernel


@pytest.fixture
def restore_backend(monkeypatch):
    # the reference warning is once per process; re-arm it so the fallback test sees it in any order
    monkeypatch.setattr(_backend, "_warned_reference", False)
    yield
    _backend._distrusted.clear()


def test_correct_ops_pass_on_cpu(restore_backend):
    report = check_ops(torch.device("cpu"), "error", log=lambda *_: None)
    assert report["ok"] and set(report["ops"]) >= {"token_logprobs", "splice_rubric", "grpo_advantages"}


def test_a_wrong_op_stops_the_run(restore_backend):
    with pytest.raises(SystemExit, match="grpo_advantages"):
        check_ops(torch.device("cpu"), "error", log=lambda *_: None,
                  ops={"grpo_advantages": wrong_grpo_advantages})
    assert ops.backend().get("distrusted") is None


def test_fallback_uses_the_reference_ops_and_says_so(restore_backend):
    with pytest.warns(RuntimeWarning, match="FALLING BACK"):
        report = check_ops(torch.device("cpu"), "fallback", log=lambda *_: None,
                           ops={"grpo_advantages": wrong_grpo_advantages})
    assert not report["ok"] and report["fallback"] and not report["ops"]["grpo_advantages"]["ok"]
    assert "cpu" in ops.backend()["distrusted"]
    assert _backend.native_kind(torch.device("cpu")) is None  # every op now takes the reference path
    rewards, groups = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0, 0, 1])
    with pytest.warns(RuntimeWarning, match="grpo_advantages: using the pure-torch reference"):
        fallen_back = ops.grpo_advantages(rewards, groups)
    assert torch.equal(fallen_back, reference.grpo_advantages(rewards, groups))


def test_off_skips(restore_backend):
    assert "skipped" in check_ops(torch.device("cpu"), "off")
