"""model.lora: peft's adapters on the policy; the reference and the local verifier are its base
without them, sharing every tensor; KL exactly 0 at step 0; the same step as with a separate frozen
copy of the base; checkpoints in peft's format that resume exactly; the merged export; the errors."""

import json

import pytest
import torch
from peft import PeftModel

from orsd.train import lora
from orsd.train.build import build_verifier, make_env
from orsd.train.cli import export_main, main, run
from orsd.train.config import ConfigError, load_config
from orsd.train.model import frozen_copy, load_policy, load_tokenizer
from orsd.train.trainer import Trainer
from scripted import ScriptedEngine, small_config
from test_resume import config_for, records

LORA = ("model.lora.rank=4", "model.lora.alpha=8")


def adapted(model_dir, *overrides, seed=0):
    """The config of a LoRA step on `model_dir` and the base policy (adapters not yet injected)."""
    config = small_config(f"model.path={model_dir}", *LORA, *overrides)
    policy = load_policy(str(model_dir))
    torch.manual_seed(seed)
    return config, policy


def perturb(policy):
    """Move the adapters off their zero start (B = 0), as training would."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def test_the_reference_is_the_base_without_a_copy_and_the_kl_starts_at_zero(tiny_smol_dir):
    config, policy = adapted(tiny_smol_dir, "method.name=grpo", "optim.kl_coef=0.05")
    total = sum(p.numel() for p in policy.parameters())
    linears = set(lora.linear_names(policy))
    assert linears == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    reference = lora.base_view(policy)
    trainable = lora.inject(policy, config.model.lora)
    assert 0 < trainable < total // 10
    assert {n for n, p in policy.named_parameters() if p.requires_grad} == {
        n for n, _ in policy.named_parameters() if "lora_" in n}
    # every tensor of the reference is one of the policy's: nothing was copied
    policy_tensors = {p.data_ptr() for p in policy.parameters()}
    assert all(p.data_ptr() in policy_tensors for p in reference.parameters())
    assert not any("lora_" in n for n, _ in reference.named_parameters())
    adapted_names = {n.split(".lora_A")[0] for n, _ in policy.named_parameters() if "lora_A" in n}
    assert {name.rsplit(".", 1)[-1] for name in adapted_names} == linears  # all-linear: attention and MLP
    assert len(adapted_names) == 2 * len(linears) and "lm_head" not in " ".join(adapted_names)
    tokenizer = load_tokenizer(str(tiny_smol_dir))
    trainer = Trainer(config, policy, tokenizer, reference, None, make_env(config),
                      engine=ScriptedEngine(policy, tokenizer, config.env.name))
    result = trainer.step()
    assert result.metrics["kl"] == 0.0  # B = 0: the policy's log-probs are the base's to the bit
    assert result.metrics["grad_norm"] > 0
    # the step moved the adapters (B) and nothing else, so the policy has left its reference
    base = {n: p.detach().clone() for n, p in reference.named_parameters()}
    assert trainer.step().metrics["kl"] > 0
    assert all(torch.equal(p, base[n]) for n, p in reference.named_parameters())


@pytest.mark.parametrize("method, top", [("orsd", 0), ("grpo", 0), ("orsd", 1)])
def test_a_step_equals_one_with_a_separate_frozen_copy_of_the_base(method, top, tiny_smol_dir):
    """Δ, the reference pass, the local verifier's scores and the update: bit for bit the same whether
    the reference is the base view (no copy) or a deep copy of the base made before the adapters.
    top=1 (optim.train_layers=1): adapters in the top layer only, the layer below frozen, its states
    reused by the reference pass and the update as in full training."""
    from orsd.engines import frozen
    from orsd.train.model import freeze_below

    tokenizer = load_tokenizer(str(tiny_smol_dir))
    results = []
    for separate in (False, True):
        config, policy = adapted(tiny_smol_dir, f"method.name={method}", "optim.kl_coef=0.05",
                                 f"optim.train_layers={top}")
        reference = frozen_copy(policy) if separate else lora.base_view(policy)
        torch.manual_seed(0)
        lora.inject(policy, config.model.lora, top)
        freeze_below(policy, top, "optim.train_layers")
        adapted_layers = {int(n.split("layers.")[1].split(".")[0]) for n, _ in policy.named_parameters()
                          if "lora_A" in n}
        assert adapted_layers == ({1} if top else {0, 1}) and frozen.frozen_layers(policy) == (1 if top else 0)
        perturb(policy)
        verifier = build_verifier(config, reference, tokenizer) if method == "orsd" else None
        trainer = Trainer(config, policy, tokenizer, reference, verifier, make_env(config),
                          engine=ScriptedEngine(policy, tokenizer, config.env.name))
        trainer.writer.initial_engine = ScriptedEngine(reference, tokenizer, config.env.name)
        result = trainer.step()
        results.append((result, {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}))
    (view, view_weights), (copied, copied_weights) = results
    assert view.metrics["kl"] > 0  # the adapters moved the policy off its base: the reference matters
    for key in ("loss", "pg_loss", "kl", "grad_norm", "delta_mean", "delta_abs_mean", "advantage_abs_mean",
                "reward_mean"):
        assert view.metrics[key] == copied.metrics[key], key
    assert [r["scores"] for r in view.records] == [r["scores"] for r in copied.records]  # the verifier's
    if method == "orsd":
        assert view.metrics["groups_with_bundle"] > 0 and view.metrics["delta_abs_mean"] > 0
    assert view_weights.keys() == copied_weights.keys()
    for name in view_weights:
        assert torch.equal(view_weights[name], copied_weights[name]), name


@pytest.mark.slow
def test_checkpoints_are_peft_adapters_that_resume_exactly_and_export_merged(tiny_smol_dir, tmp_path, monkeypatch):
    extra = (*LORA, "method.name=grpo", "warm_start.enabled=false", "optim.train_layers=0")
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    run(config_for(tiny_smol_dir, 2, *extra), str(unbroken), log=lambda *_: None)
    step = unbroken / "checkpoints" / "step_2"
    assert (step / "adapter_config.json").is_file() and (step / "adapter_model.safetensors").is_file()
    assert not list(step.glob("model*.safetensors"))  # the adapters only: the base is model.path
    assert lora.saved_settings(step)["base"] == str(tiny_smol_dir)
    counted = json.loads((unbroken / "environment.json").read_text())["parameters"]
    adapters = sum(t.numel() for t in lora.adapter_state(load_policy(str(step))).values())
    assert counted["trainable"] == adapters and 0 < adapters < counted["total"] / 10

    # peft itself loads it onto the base and computes what orsd's policy computes
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    ours = load_policy(str(step)).eval()
    theirs = PeftModel.from_pretrained(load_policy(str(tiny_smol_dir)), str(step)).eval()
    with torch.no_grad():
        ours_logits, theirs_logits = ours(ids).logits, theirs(ids).logits
        base_logits = load_policy(str(tiny_smol_dir)).eval()(ids).logits
    assert torch.equal(ours_logits, theirs_logits)
    assert not torch.allclose(ours_logits, base_logits)  # two steps moved the adapters

    # one step, then --resume to two: the records and the adapters of an unbroken run
    run(config_for(tiny_smol_dir, 1, *extra), str(broken), log=lambda *_: None)
    run(config_for(tiny_smol_dir, 2, *extra), str(broken), resume=True, log=lambda *_: None)
    assert records(unbroken) == records(broken)
    from safetensors.torch import load_file

    a = load_file(str(step / "adapter_model.safetensors"))
    b = load_file(str(broken / "checkpoints" / "step_2" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    out = tmp_path / "merged"
    assert export_main([str(step), str(out)]) == 0
    assert not lora.is_adapter_dir(out) and (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    with torch.no_grad():
        merged_logits = load_policy(str(out)).eval()(ids).logits
    torch.testing.assert_close(merged_logits, ours_logits, rtol=1e-5, atol=1e-5)
    # what the vllm engine starts from and every weight push sends: the same merge, under the base's names
    pushed = tmp_path / "vllm_start"
    lora.save_merged(ours, pushed)
    with torch.no_grad():
        pushed_logits = load_policy(str(pushed)).eval()(ids).logits
    torch.testing.assert_close(pushed_logits, ours_logits, rtol=1e-5, atol=1e-5)


def test_adapters_of_a_bf16_policy_train_in_f32(tiny_smol_dir):
    """peft injects adapters in the base's dtype; in bf16 an AdamW step of lr 1e-5 on lora_A's entries
    rounds away. orsd keeps them in f32 (as get_peft_model does) and the base in bf16: one step moves
    every lora_A."""
    config = small_config(f"model.path={tiny_smol_dir}", *LORA)
    policy = load_policy(str(tiny_smol_dir), "bfloat16")
    lora.inject(policy, config.model.lora)
    adapters = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    assert adapters and {p.dtype for p in adapters.values()} == {torch.float32}
    assert {p.dtype for n, p in policy.named_parameters() if n not in adapters} == {torch.bfloat16}
    perturb(policy)
    before = {n: p.detach().clone() for n, p in adapters.items() if "lora_A" in n}
    optimizer = torch.optim.AdamW(adapters.values(), lr=1e-5)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = policy(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    assert all(not torch.equal(before[n], adapters[n]) for n in before)


@pytest.mark.parametrize("overrides, names", [
    (["model.lora.rank=-1"], "model.lora.rank=-1 is invalid: expected an integer >= 0"),
    (["model.lora.rank=8", "distributed.zero_stage=3", "rollout.engine=vllm", "rubric.no_repeat_ngram_size=0",
      "rubric.draft_tokens=0"], "model.lora.rank=8 is invalid: expected 0 with distributed.zero_stage=3"),
    (["model.lora.alpha=0"], "model.lora.alpha=0"),
    (["model.lora.dropout=1"], "model.lora.dropout=1"),
    (["model.lora.nonsense=1"], "unknown config key 'model.lora.nonsense'"),
])
def test_bad_settings_are_refused_at_load(overrides, names):
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert names in str(caught.value)


def test_an_unknown_target_module_is_a_one_line_config_error(tiny_smol_dir, tmp_path, capsys):
    code = main(["--run-dir", str(tmp_path / "run"), f"model.path={tiny_smol_dir}", "model.lora.rank=4",
                 "model.lora.target_modules=[q_proj, attn_out]", "warm_start.enabled=false", "train.steps=1",
                 "train.progress=false", "optim.train_layers=0", "model.autocast="])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar: one line
    assert code == 2
    assert err.startswith("orsd-train: config error: model.lora.target_modules: ['attn_out'] name no linear layer")
    assert "q_proj" in err and "down_proj" in err  # what is allowed


def test_export_refuses_a_full_weight_checkpoint(tiny_smol_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        export_main([str(tiny_smol_dir), str(tmp_path / "out")])
    assert caught.value.code == 2
    assert "no adapter_config.json" in capsys.readouterr().err
