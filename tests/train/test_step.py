"""One training step end to end on CPU with the tiny random model, for every method."""

import json
import math
import threading

import numpy as np
import pytest
import torch

from helpers.logprobs import lp_of_response  # also imported from here by test_delta_control.py
from orsd import rubric
from orsd.rubric import VerifierResult
from orsd.train.build import build_verifier, make_env
from orsd.train.model import freeze_below, frozen_copy
from orsd.train.trainer import Trainer
from scripted import ScriptedEngine, small_config


def make_trainer(config, model, tokenizer, verifier=None):
    reference = frozen_copy(model)
    if verifier is None and config.method.name == "orsd":
        verifier = build_verifier(config, reference, tokenizer)
    trainer = Trainer(config, model, tokenizer, reference, verifier, make_env(config),
                      engine=ScriptedEngine(model, tokenizer, config.env.name))
    trainer.writer.initial_engine = ScriptedEngine(reference, tokenizer, config.env.name)
    return trainer


def check_records(result, config):
    assert len(result.groups) == len(result.records) == config.rollout.tasks_per_step
    for group in result.groups:
        assert len(group.trajectories) == config.rollout.group_size
        for trajectory in group.trajectories:
            assert not trajectory.error
            assert len(trajectory.records) == len(trajectory.actions) == len(trajectory.observations) - 1
            assert 1 <= len(trajectory.records) <= config.env.max_actions
            for turn, record in enumerate(trajectory.records):
                assert record.turn == turn
                assert record.context_ids and record.response_ids
                assert len(record.rollout_logprobs) == len(record.response_ids)
                assert all(lp <= 0 and math.isfinite(lp) for lp in record.rollout_logprobs)
                assert 0 < record.rubric_slot < len(record.context_ids)


@pytest.mark.parametrize("method", ["orsd", "grpo", "offline_rubric", "single_bundle", "random_bundle"])
def test_every_method_runs_a_step_on_webshop(method, tiny_model, tiny_tokenizer):
    config = small_config(f"method.name={method}")
    trainer = make_trainer(config, tiny_model, tiny_tokenizer)
    before = [p.detach().clone() for p in tiny_model.parameters()]
    result = trainer.step()
    check_records(result, config)
    m, out = result.metrics, result.outputs
    assert m["groups_rewards_differ"] == 1.0  # scripted: half the episodes act validly
    assert m["response_tokens"] == sum(len(r.response_ids) for g in result.groups
                                       for t in g.trajectories for r in t.records)
    assert m["replay_rollout_gap"] < 1e-3  # the plain replay reproduces the rollout's log-probs
    assert any(not torch.equal(b, p) for b, p in zip(before, tiny_model.parameters()))
    assert set(result.seconds) >= {"rollout", "advantages", "replay", "reference", "update"}
    if method == "grpo":
        assert m["groups_with_bundle"] == 0 and m["valid_token_fraction"] == 0
        assert all(not c.bundles for c in out.candidates) and out.selection == [None, None]
        return
    assert all(c.bundles for c in out.candidates), [c.errors for c in out.candidates]
    if method == "orsd":
        for candidates, scores, selection in zip(out.candidates, out.scores, out.selection):
            assert len(scores) == len(candidates.bundles) == 2
            assert all(s.scores.shape == (4, 6) for s in scores)
            assert len(selection.rho) == 2
        assert m["verifier"]["requests"] > 0
    else:  # the ablations make no verifier call and always use their bundle
        assert out.scores == [None, None]
        assert m["groups_with_bundle"] == 1.0
        assert m["valid_token_fraction"] > 0 and m["delta_abs_mean"] > 0


class ScriptedVerifier:
    """Test fake verifier: criterion scores follow whether a transcript contains the valid action
    (so bundle 0 correlates with the rewards and bundle 1 anti-correlates) — forces B* = 0."""

    def __init__(self):
        self.calls = 0

    async def ascore_many_with_events(self, task, transcripts, bundles):
        self.calls += 1
        acted = np.array([1.0 if "search[shirt]" in t else 0.0 for t in transcripts])
        rows = [acted, 1.0 - acted] + [np.full(len(transcripts), 0.5)] * (len(bundles) - 2)
        return [VerifierResult(np.repeat(rows[m][:, None], len(b.criteria), axis=1)) for m, b in enumerate(bundles)]


@pytest.mark.parametrize("placement", ["action", "observation", "task"])
def test_orsd_step_with_a_selected_bundle_shapes_advantages_by_hand(placement, tiny_model, tiny_tokenizer):
    """A scripted verifier forces B* = bundle 0; Δ, e and A = A_GRPO + α·e·Δ (Eq. 8–9) are then
    checked by hand on every record of the first trajectory against plain forwards of the two
    contexts, with the rubric after or before each turn's observation or before the task."""
    config = small_config("method.name=orsd", "rubric.alpha=0.5", "rollout.temperature=0.8",
                          f"rubric.placement={placement}")
    verifier = ScriptedVerifier()
    trainer = make_trainer(config, tiny_model, tiny_tokenizer, verifier)
    initial = frozen_copy(tiny_model)  # the replay runs under the rollout weights, before the update
    result = trainer.step()
    out = result.outputs
    assert verifier.calls == 2
    assert [s.index for s in out.selection] == [0, 0]
    assert all(s.rho[0] > 0 > s.rho[1] for s in out.selection)
    group = result.groups[0]
    records = group.trajectories[0].records
    assert len(records) >= 2  # a later turn, where the two placements differ
    slots = {r.rubric_slot for t in group.trajectories for r in t.records}
    if placement == "task":  # after the system prompt: the same slot on every turn of the task
        assert len(slots) == 1
    elif placement == "action":  # after the observation: only the reply's generation prompt follows
        assert len(slots) > 1
        from orsd.train.rollout import render

        turn = [{"role": "user", "content": "look"}]
        prompt = render(tiny_tokenizer, turn)[len(render(tiny_tokenizer, turn, False)):]
        assert prompt and all(r.context_ids[r.rubric_slot:] == prompt for t in group.trajectories for r in t.records)
    else:
        assert len(slots) > 1 and min(slots) == records[0].rubric_slot
    bundle = out.candidates[0].bundles[0]
    rubric_ids = rubric.rubric_context(bundle)
    from orsd.train.bundles import rubric_ids as ids_of

    spliced = ids_of(tiny_tokenizer, rubric_ids, "system")
    replay, a_grpo = out.replay, out.advantages.episode[0][0]
    for index, record in enumerate(records):  # group 0's first trajectory leads the packing
        context_with = record.context_ids[:record.rubric_slot] + spliced + record.context_ids[record.rubric_slot:]
        lp_without = lp_of_response(initial, record.context_ids, record.response_ids, 0.8)
        lp_with = lp_of_response(initial, context_with, record.response_ids, 0.8)
        start = int(replay.packed.cu_seqlens[index]) + len(record.context_ids)
        span = slice(start, start + len(record.response_ids))
        assert replay.valid[span].all()  # e = 1 on every response token of an eligible record
        assert replay.delta[span].double() == pytest.approx(lp_with - lp_without, abs=1e-5)
        assert replay.advantages[span].double() == pytest.approx(a_grpo + 0.5 * (lp_with - lp_without), abs=1e-5)
        assert (lp_with - lp_without).abs().max() > 1e-4  # the rubric really changes the log-probs
    assert result.records[0]["selected"] == 0 and result.records[0]["delta_example"]["turns"]


def test_offline_rubric_keeps_the_first_bundle_per_task(tiny_model, tiny_tokenizer):
    config = small_config("method.name=offline_rubric", "rollout.tasks_per_step=1")
    trainer = make_trainer(config, tiny_model, tiny_tokenizer)
    first = trainer.step()
    task = first.groups[0].task
    kept = trainer.method.kept[task.id].bundles
    trainer.task_rng.seed(config.train.seed)  # draw the same task again
    second = trainer.step()
    assert second.groups[0].task == task
    assert second.outputs.candidates[0].bundles == kept
    generated = sum(1 for prompts, _ in trainer.writer.initial_engine.calls for _ in prompts)
    assert generated == 1  # generated once, by the initial policy, then kept
    restored = make_trainer(config, tiny_model, tiny_tokenizer)
    restored.method.load_state_dict(trainer.method.state_dict())  # what a checkpoint carries
    assert restored.method.kept[task.id].bundles == kept


def test_group_records_are_json_ready(tiny_model, tiny_tokenizer):
    config = small_config()
    result = make_trainer(config, tiny_model, tiny_tokenizer).step()
    for record in result.records:
        back = json.loads(json.dumps(record, allow_nan=False))
        assert len(back["transcripts"]) == len(back["advantages"]) == config.rollout.group_size
        assert "reward" not in json.dumps(back["bundle_texts"]).lower()


def test_bf16_autocast_step_learns_and_keeps_replay_close(tiny_model, tiny_tokenizer):
    """Mixed precision: no-grad stages and update forwards in bf16, fp32 weights."""
    config = small_config("method.name=grpo", "model.autocast=bfloat16")
    trainer = make_trainer(config, tiny_model, tiny_tokenizer)
    before = [p.detach().clone() for p in tiny_model.parameters()]
    result = trainer.step()
    assert result.metrics["replay_rollout_gap"] < 0.05  # bf16 rounding differs with batching
    assert abs(result.metrics["ratio"] - 1.0) < 1e-2  # π_old and the update's forward agree
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, tiny_model.parameters()))


@pytest.mark.parametrize("method", ["orsd", "grpo"])
def test_a_step_with_the_lower_layers_frozen_updates_only_the_top(method, tiny_model, tiny_tokenizer):
    """optim.train_layers=1 (frozen as build() does, before the trainer's optimizer): the step's
    update moves every tensor of the top layer and the final norm, and nothing else."""
    with torch.no_grad():  # a final norm of ones gets no gradient worth seeing: perturb it
        tiny_model.model.norm.weight.mul_(1.5)
    freeze_below(tiny_model, 1, "optim.train_layers")
    trainer = make_trainer(small_config(f"method.name={method}", "optim.train_layers=1"), tiny_model, tiny_tokenizer)
    before = {name: p.detach().clone() for name, p in tiny_model.named_parameters()}
    result = trainer.step()
    assert result.metrics["groups_rewards_differ"] == 1.0  # scripted: non-zero advantages
    changed = {name for name, p in tiny_model.named_parameters() if not torch.equal(p, before[name])}
    top = {name for name in before if name.startswith("model.layers.1.")}
    assert top and changed == top | {"model.norm.weight"}


def test_a_step_reusing_the_frozen_layers_states_takes_the_same_step(tiny_model, tiny_tokenizer):
    """replay.reuse_frozen on and off with the lower layer frozen: the same step (advantages, loss,
    KL to the reference, weights after the update) in fp32, and only with it on do the reference
    pass and the update leave the frozen layer unrun."""
    import copy

    freeze_below(tiny_model, 1, "optim.train_layers")
    results = []
    for reuse in (True, False):
        model = copy.deepcopy(tiny_model)
        trainer = make_trainer(small_config("method.name=orsd", "optim.train_layers=1", "optim.kl_coef=0.05",
                                            f"replay.reuse_frozen={str(reuse).lower()}"), model, tiny_tokenizer)
        calls, stage = [], [None]

        def hook(*_):  # bundles are written on a thread of their own (replay.overlap), by a twin
            if threading.current_thread() is threading.main_thread():  # holding this hook too
                calls.append(stage[0])

        model.model.layers[0].register_forward_hook(hook)
        # the reference also serves as the local verifier: only its runs within the reference pass count
        trainer.reference.model.layers[0].register_forward_hook(hook)

        def labelled(name, fn):
            def call(*args, **kwargs):
                stage[0] = name
                try:
                    return fn(*args, **kwargs)
                finally:
                    stage[0] = None
            return call

        trainer.update = labelled("update", trainer.update)
        trainer.reference_pass.logprobs = labelled("reference", trainer.reference_pass.logprobs)
        trainer.step()
        result = trainer.step()  # the second: the policy's top layer has moved off the reference's
        results.append((result.metrics, [p.detach().clone() for p in model.parameters()], set(calls)))
    (reused, reused_weights, reused_calls), (whole, whole_weights, whole_calls) = results
    assert reused["groups_rewards_differ"] == 1.0 and reused["kl"] > 0
    for key in ("loss", "kl", "grad_norm", "reward_mean", "delta_mean"):
        assert reused[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(reused_weights, whole_weights):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert not reused_calls & {"update", "reference"} and {"update", "reference"} <= whole_calls


def test_old_logprobs_from_the_rollout(tiny_model, tiny_tokenizer):
    """optim.old_logprobs=rollout puts the sampler's log-probs in the ratio (paper App. C.2), and a
    GRPO step then skips the plain pass's layers above the frozen ones, which nothing reads: the
    step (loss, KL, weights after the update) equals one that ran them, bit for bit, and only the
    replay's health metric is absent."""
    import copy

    freeze_below(tiny_model, 1, "optim.train_layers")
    config = small_config("method.name=grpo", "optim.old_logprobs=rollout", "optim.train_layers=1",
                          "optim.kl_coef=0.05")
    results = []
    for reads in (False, True):
        model = copy.deepcopy(tiny_model)
        trainer = make_trainer(config, model, tiny_tokenizer)
        trainer.reads_plain_logprobs = lambda reads=reads: reads  # True: the plain pass runs whole
        top_calls = []
        model.model.layers[1].register_forward_hook(lambda *_: top_calls.append(trainer.step_index))
        result = trainer.step()
        results.append((result, [p.detach().clone() for p in model.parameters()], len(top_calls)))
    (skipped, skipped_weights, skipped_calls), (whole, whole_weights, whole_calls) = results
    assert skipped.outputs.replay.old_logprobs is None and skipped.metrics["replay_rollout_gap"] is None
    replay = whole.outputs.replay
    scored = replay.packed.response_mask
    assert torch.allclose(replay.rollout_logprobs[scored], replay.old_logprobs[scored], atol=1e-3)
    assert whole.metrics["replay_rollout_gap"] < 1e-3
    assert abs(skipped.metrics["ratio"] - 1.0) < 1e-3 and skipped.metrics["kl"] >= 0
    assert skipped_calls < whole_calls  # the top layer ran in the reference pass and the update only
    for key in ("loss", "pg_loss", "kl", "grad_norm", "reward_mean", "advantage_abs_mean"):
        assert skipped.metrics[key] == whole.metrics[key], key
    for a, b in zip(skipped_weights, whole_weights):
        assert torch.equal(a, b)