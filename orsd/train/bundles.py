"""The rubric stages of a step: the policy writes M bundles per group, the verifier scores them,
alignment keeps B* (paper §3.2, Eq. 5–7), and B* becomes token ids to splice into contexts."""

from __future__ import annotations

import asyncio

import numpy as np

from orsd import rubric

from .engines import RolloutEngine, Sampling
from .records import Group
from .rollout import render


def transcripts(group: Group, chars: int) -> list[str]:
    """What the bundle writer and the verifier see of each trajectory: actions and observations,
    never rewards."""
    return [rubric.format_transcript(t.observations, t.actions, max_chars=chars) for t in group.trajectories]


def generate_bundles(engine: RolloutEngine, tokenizer, groups: list[Group], num_bundles: int,
                     sampling: Sampling, transcript_chars: int, template: str | None = None) -> None:
    """M candidate bundles per group from one prompt (task + all N transcripts), sampled together."""
    if not groups:
        return
    prompts = [render(tokenizer, rubric.generation_messages(g.task.description, transcripts(g, transcript_chars),
                                                            template=template))
               for g in groups]
    request_keys = [f"{g.key}:bundle:{m}" for g in groups for m in range(num_bundles)]
    generations = engine.generate([p for p in prompts for _ in range(num_bundles)], sampling, request_keys)
    for i, group in enumerate(groups):
        for gen in generations[i * num_bundles:(i + 1) * num_bundles]:
            text = tokenizer.decode(gen.ids, skip_special_tokens=True)
            bundle, reason = rubric.RubricBundle.parse_with_reason(text, source="policy")
            group.bundle_texts.append(text)
            if bundle is None:
                group.bundle_errors.append(reason)
            else:
                group.bundles.append(bundle)


def verify(verifier, groups: list[Group], transcript_chars: int) -> None:
    """Score every criterion of every bundle on every trajectory, all groups concurrently; each
    failure (trajectory, criterion, reason) is kept with its group."""

    async def run():
        return await asyncio.gather(*[
            verifier.ascore_many_with_events(g.task.description, transcripts(g, transcript_chars), g.bundles)
            for g in groups])

    for group, results in zip(groups, asyncio.run(run()) if groups else []):
        group.scores = [r.scores for r in results]
        group.verifier_events = [_event_dict(e) for r in results for e in r.events]


def _event_dict(event) -> dict:
    return event.to_dict() if hasattr(event, "to_dict") else dict(vars(event))


def align(groups: list[Group], method: str, rng: np.random.Generator) -> None:
    """Pick B* per group: Spearman argmax (Eq. 5–7), or the ablations' random / single choice."""
    for group in groups:
        if not group.bundles:
            group.selected, group.reason = None, "no candidate bundle parsed"
            continue
        result = rubric.select(method, group.scores if method == "spearman" else None,
                               np.asarray(group.rewards, dtype=float), rng=rng, num_bundles=len(group.bundles))
        group.rho = list(result.rho)
        group.satisfaction = [list(map(float, s)) for s in result.satisfaction]
        group.selected, group.reason = result.index, result.reason


def rubric_ids(tokenizer, text: str, role: str) -> list[int] | None:
    """Token ids of the privileged rubric message, as the chat template renders it between two
    messages; None when the template does not render messages independently."""
    prefix = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    before = render(tokenizer, prefix, generation_prompt=False)
    after = render(tokenizer, prefix + [{"role": role, "content": text}], generation_prompt=False)
    return after[len(before):] if after[:len(before)] == before else None
