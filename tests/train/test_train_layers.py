"""warm_start.train_layers and optim.train_layers: only the top decoder layers (and the final norm)
are fitted by the warm start, or updated by RL."""

import pytest
import torch

from orsd.train.build import build
from orsd.train.config import load_config
from orsd.train.reference import ReferencePass
from orsd.train.warmstart import Demo, fitted_layers, warm_start


def demos(tokenizer, count=4):
    text = "Task: put a clean apple in the fridge. Observation 0: You are in the middle of a room."
    answer = tokenizer.encode("Action 1: go to countertop 1", add_special_tokens=False)
    return [Demo(tokenizer.encode(text, add_special_tokens=False)[: 12 + i], answer) for i in range(count)]


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_fitting_the_top_layer_changes_only_it_and_the_final_norm(tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    with torch.no_grad():  # a final norm of ones gets no gradient worth seeing: perturb it
        tiny_model.model.norm.weight.mul_(1.5)
    before = snapshot(tiny_model)
    losses = warm_start(tiny_model, demos(tiny_tokenizer), epochs=2, lr=1e-2, batch_size=2, train_layers=1)
    assert len(losses) == 4 and losses[-1] < losses[0]
    changed = {name for name, p in tiny_model.named_parameters() if not torch.equal(p, before[name])}
    top = {name for name in before if name.startswith("model.layers.1.")}
    assert top and top <= changed  # every tensor of the top layer moved
    assert changed - top == {"model.norm.weight"}  # and nothing else but the final norm
    assert all(p.requires_grad for p in tiny_model.parameters())  # restored afterwards


def test_zero_fits_every_parameter(tiny_model, tiny_tokenizer):
    before = snapshot(tiny_model)
    warm_start(tiny_model, demos(tiny_tokenizer), epochs=1, lr=1e-2, batch_size=4, train_layers=0)
    assert {name for name, p in tiny_model.named_parameters() if not torch.equal(p, before[name])} == set(before)


def test_frozen_layers_keep_nothing_for_the_backward(tiny_model, tiny_tokenizer):
    """Below the fitted layers no tensor is saved for autograd: the memory the option exists for."""
    ids = torch.tensor([tiny_tokenizer.encode("Task: put a clean apple in the fridge.", add_special_tokens=False)])
    saved = []

    def count(module, args, output):
        saved.append((module.layer_index, output[0].requires_grad if isinstance(output, tuple) else output.requires_grad))

    hooks = []
    for index, layer in enumerate(tiny_model.model.layers):
        layer.layer_index = index
        hooks.append(layer.register_forward_hook(count))
    try:
        with fitted_layers(tiny_model, 1):
            tiny_model(input_ids=ids)
    finally:
        for hook in hooks:
            hook.remove()
    assert saved == [(0, False), (1, True)]


@pytest.mark.parametrize("top", [2, 15])
def test_as_many_layers_as_the_model_has_or_more_fits_everything(tiny_model, top):
    """The embedded default's 15 on this 2-layer model: the whole model, embeddings included."""
    with fitted_layers(tiny_model, top):
        assert all(p.requires_grad for p in tiny_model.parameters())


def test_a_model_without_a_decoder_layer_list_is_refused(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model, "get_decoder", lambda: torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"warm_start.train_layers=1: Qwen3ForCausalLM has no decoder layer list"):
        with fitted_layers(tiny_model, 1):
            pass


def test_build_gives_the_update_an_optimizer_over_the_top_layers_only(tiny_smol_dir):
    """optim.train_layers=1 of 2: the frozen half, the embeddings and the tied head are left out of
    AdamW (no moments) and take no gradients; the warm start before it still fits everything."""
    config = load_config(None, [f"model.path={tiny_smol_dir}", "method.name=grpo", "optim.train_layers=1",
                                "warm_start.enabled=true", "warm_start.episodes=1", "warm_start.epochs=1",
                                "train.progress=false", "model.autocast=bfloat16"])
    trainer, losses = build(config, log=lambda *_: None)
    policy = trainer.policy
    assert losses  # the warm start ran, over every parameter (its own train_layers is 0)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    expected = {id(p) for name, p in policy.named_parameters() if name.startswith(("model.layers.1.", "model.norm."))}
    assert expected and optimized == expected
    assert {id(p) for p in policy.parameters() if p.requires_grad} == expected
    # autocast caches the bf16 cast only of weights that require grad: the frozen linears are stored
    # in bf16 (the cast done once), the trained ones stay f32 master weights
    linears = {name: m.weight.dtype for name, m in policy.named_modules() if isinstance(m, torch.nn.Linear)}
    assert {d for n, d in linears.items() if n.startswith("model.layers.0.")} == {torch.bfloat16}
    assert {d for n, d in linears.items() if n.startswith("model.layers.1.")} == {torch.float32}
    assert policy.get_input_embeddings().weight.dtype == torch.float32  # and the head tied to it
    # the reference holds the policy's frozen values: the plain pass's states of layer 0 serve it too
    assert trainer.reference_pass.shares_bottom(1)
    # ... and holds them in the policy's own tensors (model.share_frozen), the trained layer in its own
    mine, theirs = policy.model.layers, trainer.reference.model.layers
    assert theirs[0].mlp.up_proj.weight is mine[0].mlp.up_proj.weight
    assert theirs[1].mlp.up_proj.weight is not mine[1].mlp.up_proj.weight
    # a reference whose bottom layer differs (one not copied from this policy) is not served by them
    changed = theirs[0].mlp.up_proj.weight.detach().clone()
    changed[0, 0] += 1.0
    theirs[0].mlp.up_proj.weight = torch.nn.Parameter(changed, requires_grad=False)
    assert not ReferencePass(trainer.reference, policy, trainer.config).shares_bottom(1)
