"""The probe's Δ is training's Δ: the same splice and replay (orsd.train.replay.paired_replay), and
both equal a from-scratch forward of the spliced sequence."""

import numpy as np
import pytest
import torch

from orsd import envs
from orsd.envs.prompts import prompt_templates
from orsd.envs.webshop.oracle import oracle_rubric
from orsd.probe.kinds import rubric_token_ids
from orsd.probe.scoring import score_task
from orsd.probe.states import expert_states
from orsd.rubric import RubricBundle
from orsd.rubric.controls import content_free_bundle
from orsd.train.config import load_config
from orsd.train.evaluate import eval_tasks, make_eval_env
from orsd.train.replay import ReplaySpec, paired_replay


def probe_setup(tokenizer, *overrides):
    config = load_config(None, ["model.autocast=", *overrides])
    env = make_eval_env(config, "test")
    shadow = envs.make("webshop", split="test", **{**config.env.options, "max_actions": 100})
    tasks = eval_tasks(env, "test", 2)
    states, replies = expert_states(env, shadow, tokenizer, tasks, 2, config, 0,
                                    prompt_templates("webshop", config.env.prompt))
    return config, tasks, states, replies


def forward_logprobs(model, context: list[int], response: list[int], temperature: float) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([context + response])).logits[0, len(context) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1).numpy()


@pytest.mark.parametrize("placement", ["action", "observation"])
def test_probe_delta_equals_paired_replay_and_a_whole_forward(tiny_smol, smol_tokenizer, placement):
    config, tasks, states, replies = probe_setup(smol_tokenizer, f"rubric.placement={placement}",
                                                 "rollout.temperature=0.7")
    mine = [r for r in replies if r.task == 0]
    records = [r.record for r in mine]
    bundles = {"oracle": RubricBundle(oracle_rubric(tasks[0])), "misleading": RubricBundle(oracle_rubric(tasks[1]))}
    bundles["content_free"] = content_free_bundle(bundles["oracle"])
    ids = {kind: rubric_token_ids(smol_tokenizer, bundle, config) for kind, bundle in bundles.items()}
    assert len({tuple(v) for v in ids.values()}) == 3

    scores = score_task(tiny_smol, mine, ids, config)

    biggest = 0.0
    for kind, kind_ids in ids.items():  # every kind, so the kept keys/values handed back are checked too
        fresh = paired_replay(tiny_smol, records, [0.0] * len(records), [kind_ids] * len(records), 0.01,
                              ReplaySpec(0.7, config.replay.token_budget))
        cu = fresh.packed.cu_seqlens.tolist()
        for j, record in enumerate(records):
            delta = fresh.delta[cu[j] + len(record.context_ids):cu[j + 1]].numpy()
            probe_delta = scores.kinds[kind][j] - scores.plain[j]
            np.testing.assert_allclose(probe_delta, delta, atol=1e-4)
            biggest = max(biggest, float(np.abs(delta).max()))
    assert biggest > 1e-2  # Δ is not trivially zero here, so the comparisons above can fail

    for j in (0, len(records) - 1):  # the splice itself: the rubric message at the slot, nowhere else
        record = records[j]
        slot = record.rubric_slot
        spliced = record.context_ids[:slot] + ids["oracle"] + record.context_ids[slot:]
        np.testing.assert_allclose(scores.kinds["oracle"][j],
                                   forward_logprobs(tiny_smol, spliced, record.response_ids, 0.7), atol=1e-4)
        np.testing.assert_allclose(scores.plain[j],
                                   forward_logprobs(tiny_smol, record.context_ids, record.response_ids, 0.7), atol=1e-4)


def test_the_action_slot_is_right_before_the_generation_prompt(smol_tokenizer):
    """placement=action (the default): the rubric is the last message before the reply."""
    _, _, _, replies = probe_setup(smol_tokenizer)
    prompt = smol_tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    for reply in replies:
        assert reply.record.context_ids[reply.record.rubric_slot:] == prompt


def test_a_rubric_that_does_not_fit_the_context_budget_is_not_spliced(tiny_smol, smol_tokenizer):
    """Trainer.paired_replay's rule (e = 0 where the spliced sequence exceeds max_context_tokens)."""
    config, tasks, _, replies = probe_setup(smol_tokenizer)
    mine = [r for r in replies if r.task == 0][:2]
    longest = max(r.record.num_tokens for r in mine)
    shortest = min(r.record.num_tokens for r in mine)
    ids = rubric_token_ids(smol_tokenizer, RubricBundle(oracle_rubric(tasks[0])), config)
    # a budget between the two spliced lengths: the shorter record is spliced, the longer is not
    budget = (shortest + longest) // 2 + len(ids)
    assert shortest + len(ids) <= budget < longest + len(ids)
    config = load_config(None, ["model.autocast=", f"rollout.max_context_tokens={budget}"])
    scores = score_task(tiny_smol, mine, {"oracle": ids}, config)
    spliced = [s is not None for s in scores.kinds["oracle"]]
    assert spliced == [r.record.num_tokens + len(ids) <= budget for r in mine] and sorted(spliced) == [False, True]
