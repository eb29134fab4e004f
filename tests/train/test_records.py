"""Token-in/token-out records on a real chat template (SmolLM2-135M-Instruct's tokenizer).

The policy here is a tiny random Llama with SmolLM2's vocabulary: the template and the tokenizer
are the real ones, only the weights are small.
"""

import random

import pytest
import torch

from orsd import envs, ops
from orsd.envs.prompts import build_messages
from orsd.train.bundles import rubric_ids
from orsd.engines.base import Generation, Sampling
from orsd.engines.hf import HfEngine
from orsd.train.model import load_tokenizer
from orsd.train.packing import pack
from orsd.train.replay import ReplaySpec, paired_replay
from orsd.train.rollout import Episodes, build_context, render, rollout

RUBRIC_TEXT = "Process rubric for this task (privileged guidance):\n1. Search first.\n2. Check the price."


@pytest.fixture(scope="module")
def smol_tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def smol_shaped_model(smol_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True, eos_token_id=smol_tokenizer.eos_token_id,
                         pad_token_id=smol_tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


class OddTokenizationEngine(HfEngine):
    """Test fake: replies with a valid action spelled one character per token, an id sequence the
    tokenizer would never produce from the text; records must keep exactly these ids."""

    TEXT = "<think>go</think><action>search[red shirt]</action>"

    def generate(self, prompts, sampling, keys=None):
        ids = [self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(c)[0]) for c in self.TEXT]
        ids.append(self.stop_ids[0])
        self.sent = ids
        return [Generation(ids=list(ids), logprobs=[-1.0] * len(ids), finished=True) for _ in prompts]


def shop_episode_state(tokenizer):
    env = envs.make("webshop", max_actions=5)
    task = env.sample_task(random.Random(3))
    episode = env.fork()
    observations, actions = [episode.reset(task)], []
    for _ in range(2):
        action = episode.expert_action()
        observation, _, _ = episode.step(action)
        actions.append(action)
        observations.append(observation)
    from orsd.train.records import Trajectory

    return episode, task, Trajectory(task=task, observations=observations, actions=actions)


@pytest.mark.parametrize("placement", ["action", "observation"])
def test_spliced_context_equals_the_template_with_the_rubric_message_inserted(smol_tokenizer, placement):
    episode, task, trajectory = shop_episode_state(smol_tokenizer)
    context, slot, dropped = build_context(smol_tokenizer, episode, trajectory, 8192, placement=placement)
    assert not dropped
    messages = build_messages(episode, task, trajectory.observations, trajectory.actions, episode.admissible_actions())
    assert context == render(smol_tokenizer, messages)
    rubric = rubric_ids(smol_tokenizer, RUBRIC_TEXT, "system")
    at = len(messages) if placement == "action" else len(messages) - 1  # after or before the observation
    with_rubric = messages[:at] + [{"role": "system", "content": RUBRIC_TEXT}] + messages[at:]
    assert render(smol_tokenizer, with_rubric) == context[:slot] + rubric + context[slot:]
    if placement == "action":  # all that follows the rubric is the reply's generation prompt
        assert context[slot:] == render(smol_tokenizer, messages)[len(render(smol_tokenizer, messages, False)):]
        assert build_context(smol_tokenizer, episode, trajectory, 8192)[1] == slot  # the default
    # the op does the same splice on a packed batch
    ids = torch.tensor(context, dtype=torch.long)
    new_ids, _, pos_map = ops.splice_rubric(ids, torch.tensor([0, len(context)]), torch.tensor([slot]),
                                            torch.tensor(rubric), torch.tensor([0, len(rubric)]),
                                            torch.tensor([0]))
    assert new_ids.tolist() == render(smol_tokenizer, with_rubric)
    assert torch.equal(new_ids[pos_map], ids)


@pytest.mark.parametrize("history", [0, 1])
def test_task_placement_splices_the_rubric_after_the_system_prompt(smol_tokenizer, history):
    episode, task, trajectory = shop_episode_state(smol_tokenizer)
    context, slot, dropped = build_context(smol_tokenizer, episode, trajectory, 8192, history, placement="task")
    _, observation_slot, _ = build_context(smol_tokenizer, episode, trajectory, 8192, history, placement="observation")
    assert dropped == bool(history) and 0 < slot < observation_slot
    messages = build_messages(episode, task, trajectory.observations, trajectory.actions, episode.admissible_actions())
    if history:
        messages = messages[:2] + messages[-3:]  # the task message, one (action, observation) pair, the last
    assert context == render(smol_tokenizer, messages)
    rubric = rubric_ids(smol_tokenizer, RUBRIC_TEXT, "system")
    with_rubric = messages[:1] + [{"role": "system", "content": RUBRIC_TEXT}] + messages[1:]
    assert render(smol_tokenizer, with_rubric) == context[:slot] + rubric + context[slot:]
    # every turn of the task, the first included, gets the same slot: what precedes it is the system prompt
    first = type(trajectory)(task=task, observations=trajectory.observations[:1], actions=[])
    first_context, first_slot, _ = build_context(smol_tokenizer, episode, first, 8192, history, placement="task")
    assert first_slot == slot and first_context[:slot] == context[:slot]
    assert first_slot == build_context(smol_tokenizer, episode, first, 8192, history, placement="observation")[1]


def test_an_unknown_placement_is_refused(smol_tokenizer):
    episode, _, trajectory = shop_episode_state(smol_tokenizer)
    with pytest.raises(ValueError, match="placement.*'action', 'observation', 'task'"):
        build_context(smol_tokenizer, episode, trajectory, 8192, placement="start")


def test_history_is_dropped_oldest_first_to_fit(smol_tokenizer):
    episode, task, trajectory = shop_episode_state(smol_tokenizer)
    full, _, _ = build_context(smol_tokenizer, episode, trajectory, 8192)
    short, slot, dropped = build_context(smol_tokenizer, episode, trajectory, len(full) - 1)
    assert dropped and len(short) < len(full) and slot > 0
    text = smol_tokenizer.decode(short)
    assert task.description.split(",")[0][:20] in text  # the task message is always kept
    assert trajectory.observations[-1][:40] in text  # and the current observation


def test_sampled_ids_are_never_retokenized(smol_tokenizer, smol_shaped_model):
    engine = OddTokenizationEngine(smol_shaped_model, smol_tokenizer)
    env = envs.make("webshop", max_actions=2)
    groups = rollout(engine, smol_tokenizer, env, [env.sample_task(random.Random(0))], Episodes(2, Sampling(), 8192))
    text = engine.TEXT
    assert smol_tokenizer.encode(text, add_special_tokens=False) != engine.sent[:-1]  # really non-canonical
    for trajectory in groups[0].trajectories:
        assert trajectory.actions == ["search[red shirt]", "search[red shirt]"]
        for record in trajectory.records:
            assert record.response_ids == engine.sent  # exactly what was sampled
    records = [r for t in groups[0].trajectories for r in t.records]
    packed = pack(records)
    start = len(records[0].context_ids)
    assert packed.ids[start:start + len(engine.sent)].tolist() == engine.sent  # and what replay scores


def test_alignment_mask_is_zero_where_splicing_fails(smol_tokenizer, smol_shaped_model):
    episode, task, trajectory = shop_episode_state(smol_tokenizer)
    context, slot, _ = build_context(smol_tokenizer, episode, trajectory, 8192)
    response = smol_tokenizer.encode("<action>click[Buy Now]</action>", add_special_tokens=False)
    from orsd.train.records import TurnRecord

    def rec(slot_value):
        return TurnRecord(0, context, response, [0.0] * len(response), slot_value, "", None, "", True, False,
                          False, False)

    rubric = rubric_ids(smol_tokenizer, RUBRIC_TEXT, "system")
    # record 0 splices; record 1 has no usable slot (the trainer passes None for it): e = 0 there
    out = paired_replay(smol_shaped_model, [rec(slot), rec(-1)], [1.0, 1.0], [rubric, None], 0.1,
                        ReplaySpec(1.0, 65536))
    length = len(context) + len(response)
    assert out.valid[:length].sum() == len(response)
    assert not out.valid[length:].any()
    assert (out.advantages[length + len(context):] == 1.0).all()
