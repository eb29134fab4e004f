"""benchmarks/cost_model.py: its FLOP counts against benchmarks/flops.py's counter on a tiny model, its
decode roofline, monotonicity in the shape, and a memory estimate whose pieces add up."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cost_model as cm  # noqa: E402
from flops import CPU_OPS  # noqa: E402
from tiny_model import make_tiny_qwen3, make_tiny_tokenizer  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_qwen3(make_tiny_tokenizer(), layers=2)
    c = model.config
    shape = cm.Model("tiny", c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                     c.num_key_value_heads, c.head_dim, c.vocab_size)
    return model, shape


def counted(fn) -> int:
    counter = FlopCounterMode(display=False, custom_mapping=CPU_OPS)
    with counter:
        fn()
    return counter.get_total_flops()


def test_forward_flops_equal_the_counters_on_a_tiny_qwen3(tiny):
    model, shape = tiny
    n = 37
    ids = torch.randint(0, shape.vocab, (1, n))
    with torch.no_grad():
        got = counted(lambda: model(ids))
    # the counter charges attention its whole s_q x s_k rectangle (the work the CPU kernel is asked
    # for); the head scores every position here
    assert got == shape.forward_flops(n, n * n, n)
    # the same by hand: q (64x64), k and v (64x32 each), o (64x64), gate, up, down (64x128)
    assert shape.layer_params == 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128


def test_training_flops_equal_the_counters_forward_and_backward(tiny):
    model, shape = tiny
    n = 29
    ids = torch.randint(0, shape.vocab, (1, n))
    model.train()
    try:
        got = counted(lambda: model(ids).logits.float().logsumexp(-1).sum().backward())
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)
    want = cm.train_flops(shape, n, n * n, n, checkpointing=False, fused_head=False)
    assert got == pytest.approx(want, rel=1e-9)


def test_a_trajectory_fills_its_budget_and_the_tree_forwards_less_than_whole_records():
    s = cm.WEBSHOP
    contexts = s.contexts()
    assert len(contexts) == s.turns and contexts[0] == s.first_context
    assert contexts[-1] + s.reply_tokens == pytest.approx(s.budget)
    assert all(b > a for a, b in zip(contexts, contexts[1:]))
    costs = cm.stage_costs(s, cm.QWEN3_1P7B, cm.A100_80GB, 4)
    # whole records forward each turn's history again: far more than 3x (forward + backward) the
    # plain pass, which forwards a trajectory's history once along the prefix tree
    assert costs["update"]["flops"] > 5 * costs["plain_replay"]["flops"]
    tree = cm.stage_costs(replace(s, update_shares_prefix=True, checkpointing=False), cm.QWEN3_1P7B, cm.A100_80GB, 4)
    assert tree["update"]["flops"] < costs["update"]["flops"] / 3
    assert costs["plain_replay"]["flops"] == costs["reference"]["flops"]  # the same tokens, every layer


def test_decode_is_bandwidth_bound_for_few_rows_and_compute_bound_for_many():
    model, device = cm.QWEN3_1P7B, cm.A100_80GB
    one = cm.decode(model, device, batch=1, steps=10, context=1000)
    assert one["seconds"] == pytest.approx(one["bytes"] / device.bandwidth)
    many = cm.decode(model, device, batch=4096, steps=10, context=16)
    assert many["seconds"] == pytest.approx(many["flops"] / device.matmul)
    # a longer context reads more keys and values per step
    assert cm.decode(model, device, 16, 10, 8000)["seconds"] > cm.decode(model, device, 16, 10, 1000)["seconds"]


@pytest.mark.parametrize("field,larger", [("turns", 60), ("budget", 40_000), ("reply_tokens", 400),
                                          ("bundles", 8), ("rubric_tokens", 400), ("bundle_tokens", 2048)])
def test_every_stage_grows_with_the_shape(field, larger):
    base = cm.WEBSHOP
    bigger = replace(base, **{field: larger})
    a = cm.stage_costs(base, cm.QWEN3_1P7B, cm.A100_80GB, 4)
    b = cm.stage_costs(bigger, cm.QWEN3_1P7B, cm.A100_80GB, 4)
    assert all(b[k]["seconds"] >= a[k]["seconds"] for k in a), field
    assert cm.step_seconds(b, "orsd") > cm.step_seconds(a, "orsd")


def test_a_larger_model_or_fewer_ranks_costs_more_and_orsd_costs_more_than_grpo():
    s = cm.ALFWORLD
    small = cm.stage_costs(s, cm.QWEN3_1P7B, cm.A100_80GB, 4)
    large = cm.stage_costs(s, cm.QWEN3_4B, cm.A100_80GB, 4)
    alone = cm.stage_costs(s, cm.QWEN3_1P7B, cm.A100_80GB, 1)
    assert all(large[k]["seconds"] > small[k]["seconds"] for k in small if k != "verifier")
    assert alone["update"]["seconds"] > small["update"]["seconds"] and alone["rollout"]["seconds"] > small["rollout"]["seconds"]
    assert cm.step_seconds(small, "orsd") > cm.step_seconds(small, "orsd", verifier=False) > cm.step_seconds(small, "grpo")
    assert set(cm.GRPO_STAGES) < set(cm.ORSD_STAGES)


def test_the_memory_estimate_adds_up_and_says_whether_it_fits():
    for ranks, fraction in ((4, 0.5), (4, 0.72), (1, 0.5)):
        m = cm.memory(cm.WEBSHOP, cm.QWEN3_1P7B, cm.A100_80GB, ranks, fraction)
        assert m["total"] == pytest.approx(sum(m["parts"].values()))
        assert m["parts"]["vllm"] == pytest.approx(fraction * cm.A100_80GB.memory)
        assert m["fits"] == (m["total"] <= cm.A100_80GB.memory)
    four = cm.memory(cm.WEBSHOP, cm.QWEN3_1P7B, cm.A100_80GB, 4, 0.5)["parts"]
    one = cm.memory(cm.WEBSHOP, cm.QWEN3_1P7B, cm.A100_80GB, 1, 0.5)["parts"]
    assert one["master_moments_grad_f32_shard"] == pytest.approx(4 * four["master_moments_grad_f32_shard"])
    assert four["weights_bf16"] == pytest.approx(2 * cm.QWEN3_1P7B.params)
    huge = cm.memory(cm.WEBSHOP, cm.QWEN3_4B, replace(cm.A100_80GB, memory=1e9), 4, 0.5)
    assert not huge["fits"]


def test_the_h200_rates_are_read_from_the_committed_measurements():
    h200 = cm.h200_measured()
    assert h200.matmul == pytest.approx(708e12) and h200.bandwidth == pytest.approx(4221e9)
    assert h200.source == "measured" and cm.A100_80GB.source == "datasheet"
    assert 140 * 2**30 < h200.memory < 141 * 2**30


def test_the_plan_covers_both_settings_models_and_devices():
    rows = cm.plan()
    assert {(r["setting"], r["model"], r["ranks"]) for r in rows} == {
        (s, m, k) for s in ("ALFWorld", "WebShop") for m in ("Qwen3-1.7B", "Qwen3-4B") for k in (4, 1)}
    for r in rows:
        assert all(math.isfinite(v["seconds"]) and v["seconds"] > 0 for v in r["stages"].values())
        assert r["orsd_step"] > r["grpo_step"] > 0
        assert r["orsd_run_hours"] == pytest.approx(r["orsd_step"] * 300 / 3600)
        assert set(r["memory"]) == {0.50, 0.72}
    assert rows[0]["stages"]["verifier"]["requests"] == 8 * 8 * 4
    assert "| ALFWorld | Qwen3-1.7B | 4 x A100 80GB (datasheet) |" in cm.markdown(rows)
