"""The probe's states and replies: expert episodes, wrong replies at the same states, and the
policy's own turns labelled against the expert.

Every reply is a `TurnRecord` exactly as a rollout would have made it, so paired replay treats it
as a training record: its context is `rollout.build_context`'s (the run's prompt templates,
history window, context budget and rubric slot), and a scripted reply is spelled as the warm start
spells demonstrations (`demonstration_answer` + end of turn, `warmstart.answer_ids`).

A wrong reply is a valid command that is not the expert's and after which the expert needs more
actions to buy the target, or can no longer buy it (checked by playing the expert on from it in a
copy of the episode): an option clicked in another order than the expert's, or another product
that can score 1.0, is as good as the expert's and so is never called wrong. On the search page a
wrong reply is the expert's search of another task.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from orsd.envs.prompts import demonstration_answer
from orsd.envs.webshop.commands import split_command
from orsd.envs.webshop.pages import SEARCH, click_key
from orsd.train.records import Group, Trajectory, TurnRecord
from orsd.train.rollout import build_context
from orsd.train.warmstart import answer_ids

ROLES = ("expert", "wrong", "policy")


@dataclass
class Reply:
    """One response scored under every context."""

    role: str  # "expert" | "wrong" | "policy"
    task: int  # index into the probe's tasks
    page: str  # the page it answers (search, results, item, detail)
    action: str | None  # the command it gives (None: the policy's reply had none)
    matches_expert: bool  # its command is the expert's at that state
    record: TurnRecord
    state: int = -1  # index into the expert states (-1: a policy turn)
    trajectory: int = -1  # the policy's rollout it belongs to (-1: a scripted reply)


@dataclass
class State:
    """A decision state of an expert episode: the expert's reply first, then the wrong ones."""

    task: int
    turn: int
    page: str
    expert: str
    replies: list[int] = field(default_factory=list)  # indices into the probe's replies


def same_command(action: str | None, expert: str) -> bool:
    """Whether `action` is the expert's command as the shop compares them (case and whitespace
    of a click ignored; a search's words compared lower-cased)."""
    verb, argument = split_command(action)
    expert_verb, expert_argument = split_command(expert)
    if verb is None or verb != expert_verb:
        return False
    if verb == "click":
        return click_key(argument) == click_key(expert_argument)
    return " ".join(argument.lower().split()) == " ".join(expert_argument.lower().split())


def expert_cost(shadow, task, prefix: list, first: str, cap: int = 40) -> float:
    """Actions the expert needs after `first`, played after `prefix` from the start of `task`, to
    buy a product scoring 1.0 (`shadow`: an env whose horizon does not cut the expert short); inf
    when it does not get there."""
    shadow.reset(task)
    for action in prefix:
        shadow.step(action)
    shadow.step(first)
    steps = 0
    while not shadow.done and steps < cap:
        shadow.step(shadow.expert_action())
        steps += 1
    return float(steps) if shadow.won else math.inf


def other_searches(shadow, tasks, index: int, count: int, rng: random.Random) -> list[str]:
    """The expert's first command (a search) on up to `count` other tasks: the probe's own tasks
    first, then others of the split, in a seeded order."""
    pool = [t for i, t in enumerate(tasks) if i != index]
    rng.shuffle(pool)
    extra = [t for t in shadow.tasks(tasks[index].split) if t.id not in {u.id for u in tasks}]
    pool += rng.sample(extra, min(len(extra), 4 * count))
    out = []
    for task in pool:
        shadow.reset(task)
        search = shadow.expert_action()
        if search not in out:
            out.append(search)
    return out


def wrong_actions(episode, shadow, task, prefix: list, expert: str, searches: list[str], count: int,
                  rng: random.Random) -> list[str]:
    """Up to `count` valid commands at the episode's state that are worse than the expert's."""
    if episode.state.page == SEARCH:
        commands = searches
    else:
        commands = [f"click[{label}]" for label in episode.available_actions()["clickables"]]
    best = expert_cost(shadow, task, prefix, expert)
    candidates = [c for c in commands if not same_command(c, expert) and expert_cost(shadow, task, prefix, c) > best]
    return rng.sample(candidates, min(count, len(candidates)))


def scripted_record(tokenizer, env_name: str, action: str, turn: int, context: tuple) -> TurnRecord:
    """A reply the policy did not sample, as a rollout would record it (no rollout log-probs:
    paired replay reads them only for its replay-vs-rollout gap)."""
    ids, slot, dropped = context
    text = demonstration_answer(env_name, action)
    response = answer_ids(tokenizer, text)
    return TurnRecord(turn=turn, context_ids=list(ids), response_ids=response, rollout_logprobs=[0.0] * len(response),
                      rubric_slot=slot, response_text=text, action=action, observation="", valid_action=True,
                      no_progress=False, truncated=False, context_truncated=dropped)


def expert_states(env, shadow, tokenizer, tasks: list, wrong_per_state: int, config, seed: int,
                  templates) -> tuple[list[State], list[Reply]]:
    """Every decision state of one expert episode per task (within the run's action budget), with
    the expert's reply and up to `wrong_per_state` wrong ones."""
    r, e = config.rollout, config.env
    horizon = e.max_actions or env.max_actions
    states: list[State] = []
    replies: list[Reply] = []
    for index, task in enumerate(tasks):
        rng = random.Random(f"probe:{seed}:{task.id}")
        searches = other_searches(shadow, tasks, index, max(wrong_per_state, 1), rng)
        episode = env.fork()
        trajectory = Trajectory(task=task, observations=[episode.reset(task)], actions=[])
        while not episode.done and episode.num_actions < horizon:
            expert = episode.expert_action()
            context = build_context(tokenizer, episode, trajectory, r.max_context_tokens - r.max_new_tokens,
                                    e.max_history_turns, templates, config.rubric.placement)
            turn = len(trajectory.actions)
            state = State(task=index, turn=turn, page=episode.state.page, expert=expert)
            wrong = wrong_actions(episode, shadow, task, list(trajectory.actions), expert, searches,
                                  wrong_per_state, rng)
            for role, action in [("expert", expert)] + [("wrong", w) for w in wrong]:
                state.replies.append(len(replies))
                replies.append(Reply(role, index, state.page, action, role == "expert",
                                     scripted_record(tokenizer, env.name, action, turn, context), state=len(states)))
            states.append(state)
            observation, _, _ = episode.step(expert)
            trajectory.actions.append(expert)
            trajectory.observations.append(observation)
    return states, replies


def policy_replies(groups: list[Group], shadow) -> list[Reply]:
    """The policy's own turns, each labelled with whether its command is the expert's at that
    state (the expert's action found by replaying the trajectory's commands in `shadow`)."""
    out = []
    for index, group in enumerate(groups):
        for number, trajectory in enumerate(group.trajectories):
            shadow.reset(group.task)
            for record in trajectory.records:  # the shadow's longer horizon never ends an episode first
                expert, page = shadow.expert_action(), shadow.state.page
                out.append(Reply("policy", index, page, record.action, same_command(record.action, expert),
                                 record, trajectory=number))
                shadow.step(record.action)
    return out
