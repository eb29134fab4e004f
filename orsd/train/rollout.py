"""Multi-turn rollouts: N episodes per task, all episodes of a step advanced in lockstep.

Each turn renders the chat (system, task, action-only history, current observation) with the
tokenizer's own template, records exactly those ids and exactly the sampled ids, and steps the
environment with the parsed command. An env that raises is recorded on the trajectory and the
episode ends; the step goes on.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from orsd.envs import parse_action
from orsd.envs.prompts import build_messages, prompt_templates
from orsd.envs.rewards import episode_reward

from orsd.engines.base import RolloutEngine, Sampling
from .model import trim_heap
from .records import Group, TurnRecord, Trajectory


def render(tokenizer, messages: list[dict], generation_prompt: bool = True) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                              return_dict=False))


def message_boundary(tokenizer, messages: list[dict], index: int, full_ids: list[int]) -> int:
    """Token index where message `index` starts in `full_ids` (index = len(messages): where the
    generation prompt starts), or -1 when the template does not render the earlier messages as a
    prefix (then no privileged context can be spliced)."""
    prefix = render(tokenizer, messages[:index], generation_prompt=False)
    return len(prefix) if full_ids[:len(prefix)] == prefix else -1


PLACEMENTS = ("action", "observation", "task")


def build_context(tokenizer, env, trajectory: Trajectory, max_context_tokens: int,
                  max_history_turns: int = 0, templates=None,
                  placement: str = "action") -> tuple[list[int], int, bool]:
    """(context ids, rubric slot, history dropped?) for the trajectory's next turn.

    The slot (`rubric.placement`) is a message boundary: after the last user message, before the
    reply's generation prompt ("action": the rubric is the last thing read before acting, and the
    rubric pass forwards only it and the reply, the observation's keys/values being the plain
    pass's), before the last user message, the current observation ("observation"), or before
    the task message, after the system prompt ("task": every turn of a task shares the context up
    to and with the rubric, so the rubric pass forwards it once along the prefix tree; on the first
    turn it coincides with "observation"). The oldest (action, observation) pairs are dropped,
    after the task message, until the context fits `max_context_tokens`.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: {placement!r}; expected one of {PLACEMENTS}")
    messages = build_messages(env, trajectory.task, trajectory.observations, trajectory.actions,
                              env.admissible_actions(), templates)
    head, history, last = messages[:2], messages[2:-1], messages[-1:]
    if len(messages) < 3:  # first turn: system + task message only
        head, history, last = messages[:1], [], messages[1:]
    dropped = False
    if max_history_turns and len(history) > 2 * max_history_turns:
        history, dropped = history[len(history) - 2 * max_history_turns:], True
    while True:
        kept = head + history + last
        ids = render(tokenizer, kept)
        if len(ids) <= max_context_tokens or not history:
            break
        history, dropped = history[2:], True  # drop one (assistant, user) pair
    index = {"action": len(kept), "observation": len(kept) - 1, "task": 1}[placement]  # kept[1]: the task message
    return ids, message_boundary(tokenizer, kept, index, ids), dropped


@dataclass(frozen=True)
class Episodes:
    """How a rollout plays its episodes: `samples` per task (N), the sampling, the context budget
    (a turn's context and reply together), the action horizon (0: the env's), the history window (0:
    whole), the prompt templates (envs/prompts.py) and the rubric slot recorded per turn (rubric.placement)."""

    samples: int
    sampling: Sampling
    max_context_tokens: int
    max_actions: int = 0
    max_history_turns: int = 0
    templates: object = None
    placement: str = "action"

    @classmethod
    def from_config(cls, config, samples: int | None = None, sampling: Sampling | None = None) -> Episodes:
        """A run's: rollout.group_size samples at the rollout's sampling unless given (evaluation's)."""
        r, e = config.rollout, config.env
        return cls(r.group_size if samples is None else samples,
                   sampling or Sampling(r.temperature, r.top_p, r.max_new_tokens, top_k=r.top_k),
                   r.max_context_tokens, e.max_actions, e.max_history_turns, prompt_templates(e.name, e.prompt),
                   config.rubric.placement)


def rollout(engine: RolloutEngine, tokenizer, env, tasks: list, episodes: Episodes, key_prefix: str = "",
            group_offset: int = 0, group_keys: list[str] | None = None) -> list[Group]:
    """Play `episodes.samples` episodes of every task; returns one Group per task, rewards filled in.

    Request keys are `<group key>:<sample>:<turn>` (see RolloutEngine), the group key being
    `<key_prefix>:<global group index>` unless `group_keys` names every group (held-out evaluation:
    `heldout:<task id>`, so an episode's key does not depend on which other tasks ran)."""
    if group_keys is None:
        group_keys = [f"{key_prefix}:{group_offset + g}" for g in range(len(tasks))]
    elif len(group_keys) != len(tasks) or len(set(group_keys)) != len(group_keys):
        raise ValueError(f"group_keys: {len(group_keys)} keys for {len(tasks)} tasks: expected one distinct key "
                         "per task")
    groups = [Group(task=task, trajectories=[], key=key) for task, key in zip(tasks, group_keys)]
    live = []  # (trajectory, env fork, key of the episode)
    for g, group in enumerate(groups):
        for sample in range(episodes.samples):
            fork = env.fork()
            trajectory = Trajectory(task=group.task, observations=[], actions=[])
            group.trajectories.append(trajectory)
            try:
                trajectory.observations.append(fork.reset(group.task))
                live.append((trajectory, fork, f"{group.key}:{sample}"))
            except Exception as error:  # noqa: BLE001 - recorded on the trajectory, run goes on
                trajectory.error = f"reset failed: {error!r}"
    horizon, sampling = episodes.max_actions or env.max_actions, episodes.sampling
    while live:
        contexts = [build_context(tokenizer, fork, t, episodes.max_context_tokens - sampling.max_new_tokens,
                                  episodes.max_history_turns, episodes.templates, episodes.placement)
                    for t, fork, _ in live]
        keys = [f"{key}:{len(t.actions)}" for t, _, key in live]
        generations = engine.generate([ids for ids, _, _ in contexts], sampling, keys)
        trim_heap()  # each turn's KV cache has another size: glibc would keep the last one's pages
        still = []
        for (trajectory, fork, key), (ids, slot, dropped), gen in zip(live, contexts, generations):
            text = tokenizer.decode(gen.ids, skip_special_tokens=True)
            action = parse_action(text)
            try:
                observation, done, info = fork.step(action)
            except Exception:  # noqa: BLE001
                trajectory.error = "env step failed: " + traceback.format_exc(limit=3)
                observation, done, info = "", True, {"valid_action": False, "no_progress": False}
            trajectory.records.append(TurnRecord(
                turn=len(trajectory.actions), context_ids=ids, response_ids=gen.ids,
                rollout_logprobs=gen.logprobs, rubric_slot=slot, response_text=text, action=action,
                observation=observation, valid_action=bool(info.get("valid_action", False)),
                no_progress=bool(info.get("no_progress", False)), truncated=not gen.finished,
                context_truncated=dropped))
            trajectory.actions.append(action)
            trajectory.observations.append(observation)
            if done or fork.num_actions >= horizon:
                finish(trajectory, fork, info)
            else:
                still.append((trajectory, fork, key))
        live = still
    return groups


def finish(trajectory: Trajectory, fork, info: dict) -> None:
    """Fill in the episode's outcome: Eq. 12 (ALFWorld) or Eq. 13 (WebShop)."""
    trajectory.won = bool(info.get("won", False))
    trajectory.score = float(info.get("score", 0.0))
    trajectory.num_invalid = fork.num_invalid
    trajectory.num_no_progress = fork.num_no_progress
    trajectory.reward = 0.0 if trajectory.error else float(episode_reward(fork, info))


def sample_tasks(env, rng, count: int, pool_size: int = 0) -> list:
    """`count` training tasks drawn with `rng`: from the whole split (the paper), or with
    `pool_size` (env.train_tasks) from Env.task_pool, the same pool for every seed and method."""
    pool = env.task_pool(pool_size) if pool_size else None
    return [env.sample_task(rng) if pool is None else pool[rng.randrange(len(pool))] for _ in range(count)]
