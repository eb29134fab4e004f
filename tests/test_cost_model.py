"""benchmarks/cost_model.py: its FLOP counts against benchmarks/flops.py's counter on a tiny model, its
decode roofline, monotonicity in the shape, and a memory estimate whose pieces add up."""

from __future__ import annotations

import json
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


# -- LoRA (model.lora): the adapters' parameters, FLOPs and memory; the LoRA presets' figures -------


def test_lora_adapters_and_their_flops_equal_peft_and_the_counter_on_a_tiny_qwen3(tiny):
    """Rank-r adapters hold r·(d_in + d_out) weights per adapted linear, as peft injects them; their
    forward is 2 FLOPs a weight a token; with the base and the head frozen, the backward computes no
    dW but the adapters'."""
    from types import SimpleNamespace

    from orsd.train.lora import inject

    _, shape = tiny
    rank, n = 4, 29
    # by hand, 2 layers: q and o (64 -> 64), k and v (64 -> 32), gate and up (64 -> 128), down (128 -> 64)
    assert shape.adapter_params(rank) == 2 * rank * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 128)) == 8192
    assert shape.adapter_params(rank, targets=("q_proj", "v_proj")) == 2 * rank * ((64 + 64) + (64 + 32))
    for targets in (["q_proj", "v_proj"], []):  # the last, every linear, is the one measured below
        model = make_tiny_qwen3(make_tiny_tokenizer(), layers=2)
        trainable = inject(model, SimpleNamespace(rank=rank, alpha=8.0, dropout=0.0, target_modules=targets))
        assert trainable == shape.adapter_params(rank, targets=tuple(targets))
    ids = torch.randint(0, shape.vocab, (1, n))
    with torch.no_grad():
        assert counted(lambda: model(ids)) == shape.forward_flops(n, n * n, n, lora_rank=rank)
    model.train()
    got = counted(lambda: model(ids).logits.float().logsumexp(-1).sum().backward())
    # layer 0's q, k and v read the frozen embeddings, so no gradient flows into them: neither their base
    # weights nor their lora_A compute dX there (the model charges every layer alike)
    skipped = 2 * n * (64 * 64 + 2 * 64 * 32) + 2 * n * rank * 3 * 64
    assert got == cm.train_flops(shape, n, n * n, n, checkpointing=False, fused_head=False, lora_rank=rank) - skipped
    assert cm.train_flops(shape, n, n * n, n, False, lora_rank=rank) < cm.train_flops(shape, n, n * n, n, False)


def test_lora_memory_holds_the_adapters_state_and_no_reference(tiny):
    _, shape = tiny
    full, lora = cm.WEBSHOP, replace(cm.WEBSHOP, lora_rank=4)
    adapters = 8192  # the test above, by hand
    assert cm.trainable_params(lora, shape) == adapters and cm.trainable_params(full, shape) == shape.params
    m = cm.memory(lora, shape, cm.A100_80GB, 1, 0.0)["parts"]
    f = cm.memory(full, shape, cm.A100_80GB, 1, 0.0)["parts"]
    assert m["weights_bf16"] == 2 * (shape.params + adapters)
    assert m["gradients_bf16"] == 2 * adapters and m["master_moments_grad_f32_shard"] == 16 * adapters
    assert m["reference_bf16"] == 0 and f["reference_bf16"] == 2 * shape.params
    assert m["lm_head_copy_and_gradient"] == 2 * shape.vocab * shape.hidden == f["lm_head_copy_and_gradient"] / 2
    assert m["update_activations"] == f["update_activations"]
    assert sum(m.values()) < sum(f.values())
    # AdamW's traffic: ~30 bytes an adapter weight; one rank, no collectives
    assert cm.update_cost(lora, shape, cm.A100_80GB, 1)["bytes"] == 30 * adapters


def test_every_lora_preset_fits_its_gpu_where_full_training_does_not():
    rows = cm.lora_plan()
    paper = {(r["setting"], r["model"]): r for r in cm.plan() if r["ranks"] == 4}
    assert len(rows) == 12
    for a100, full, lora in zip(rows[::3], rows[1::3], rows[2::3]):
        assert (a100["training"], full["training"], lora["training"]) == ("full", "full", "LoRA r=16")
        assert a100["ranks"] == 4 and a100["grpo_step"] == paper[a100["setting"], a100["model"]]["grpo_step"]
        assert full["device"] == lora["device"] == cm.LORA_GPU[lora["model"]].name and lora["ranks"] == 1
        f, m = full["memory"][cm.LORA_VLLM_FRACTION], lora["memory"][cm.LORA_VLLM_FRACTION]
        assert m["fits"] and not f["fits"] and m["total"] < f["total"]
        assert lora["trainable_params"] < full["trainable_params"] / 50
        # no dW for the frozen base: a cheaper update; the same rollout (vLLM, merged) and reference (the base)
        assert lora["stages"]["update"]["seconds"] < full["stages"]["update"]["seconds"]
        assert lora["stages"]["rollout"] == full["stages"]["rollout"]
        assert lora["stages"]["reference"] == full["stages"]["reference"]
        assert lora["stages"]["plain_replay"]["flops"] > full["stages"]["plain_replay"]["flops"]  # the adapters
        assert lora["stages"]["sync"]["bytes"] > full["stages"]["sync"]["bytes"]  # merging before the push
        assert lora["orsd_step"] > lora["grpo_step"] > 0
    assert "| WebShop | Qwen3-4B | LoRA r=16 | 1 x L40S 48GB (datasheet) |" in cm.lora_markdown(rows)


def test_the_lora_constants_are_the_lora_presets_and_the_committed_figures_are_current():
    from orsd.train.config import load_config

    presets = sorted((ROOT / "configs").glob("*_lora.yaml"))
    assert presets
    for path in presets:
        config = load_config(path)
        setting = cm.WEBSHOP if config.env.name == "webshop" else cm.ALFWORLD
        assert config.model.lora.rank == cm.LORA_RANK and config.model.lora.target_modules == []
        assert config.rollout.vllm_gpu_memory_utilization == cm.LORA_VLLM_FRACTION
        assert config.model.path.split("/")[-1] in cm.LORA_GPU
        assert config.optim.micro_batch_size == setting.micro_batch_records
        assert config.model.gradient_checkpointing == setting.checkpointing
    committed = json.loads((cm.RESULTS / "cost_model_lora.json").read_text())["rows"]
    now = cm.lora_plan()
    assert [(r["grpo_step"], r["orsd_step"]) for r in committed] == [(r["grpo_step"], r["orsd_step"]) for r in now]
    assert [r["memory"][str(r["vllm_fraction"])]["total"] for r in committed] == [
        r["memory"][r["vllm_fraction"]]["total"] for r in now]
