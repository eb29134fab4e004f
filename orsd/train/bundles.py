"""The rubric stages of a step, each returning its result: the policy writes M bundles per group
(§3.1), the verifier scores every criterion on every trajectory, selection keeps B* (Eq. 5–7),
and B* becomes the token ids spliced into contexts for paired replay (Eq. 8)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import numpy as np

from orsd import rubric
from orsd.engines.base import RolloutEngine, Sampling
from orsd.methods import BundleRequest, Candidates

from . import overlap
from .records import Group
from .rollout import render


def transcripts(group: Group, chars: int) -> list[str]:
    """What the bundle writer and the verifier see of each trajectory: actions and observations,
    never rewards."""
    return [rubric.format_transcript(t.observations, t.actions, max_chars=chars) for t in group.trajectories]


def sampling(r) -> Sampling:
    """How bundles are sampled, from the config's `rubric` section."""
    return Sampling(r.temperature, r.top_p, r.max_new_tokens, no_repeat_ngram_size=r.no_repeat_ngram_size,
                    draft_tokens=r.draft_tokens)


def write_bundles(engine: RolloutEngine, tokenizer, groups: Sequence[Group], num_bundles: int,
                  sampling: Sampling, transcript_chars: int, template: str | None = None) -> list[Candidates]:
    """M candidate bundles per group from one prompt (task + all N transcripts), sampled together."""
    if not groups:
        return []
    prompts = [render(tokenizer, rubric.generation_messages(g.task.description, transcripts(g, transcript_chars),
                                                            template=template))
               for g in groups]
    request_keys = [f"{g.key}:bundle:{m}" for g in groups for m in range(num_bundles)]
    generations = engine.generate([p for p in prompts for _ in range(num_bundles)], sampling, request_keys)
    out = []
    for i in range(len(groups)):
        candidates = Candidates()
        for gen in generations[i * num_bundles:(i + 1) * num_bundles]:
            text = tokenizer.decode(gen.ids, skip_special_tokens=True)
            bundle, reason = rubric.RubricBundle.parse_with_reason(text, source="policy")
            candidates.texts.append(text)
            if bundle is None:
                candidates.errors.append(reason)
            else:
                candidates.bundles.append(bundle)
        out.append(candidates)
    return out


class BundleWriter:
    """Writes what a method's BundleRequest asks for with the run's `rubric` section: by the current
    policy through the rollout engine, or (writer="initial") by the frozen initial policy through an
    engine made by `initial_engine()` on first use."""

    def __init__(self, engine: RolloutEngine, initial_engine: Callable[[], RolloutEngine], tokenizer, rubric_config):
        self.engine, self.tokenizer, self.config = engine, tokenizer, rubric_config
        self._make_initial, self.initial_engine = initial_engine, None

    def engine_for(self, writer: str) -> RolloutEngine:
        if writer == "initial" and self.initial_engine is None:
            self.initial_engine = self._make_initial()
        return self.initial_engine if writer == "initial" else self.engine

    def write(self, request: BundleRequest | None, beside: overlap.Later | None = None,
              context: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> list[Candidates]:
        """One Candidates per group of `request`. With `beside` (the plain pass) and bundles to write,
        the writer runs on a thread of its own, under `context()` (the step's autocast), while this
        thread makes `beside`'s value (overlap.write_beside)."""
        if request is None:
            return []
        r = self.config

        def write(engine):
            return write_bundles(engine, self.tokenizer, request.groups, request.count, sampling(r),
                                 r.transcript_chars, r.generation_template or None)

        engine = self.engine_for(request.writer)
        if beside is None or not request.groups:
            return write(engine)
        return overlap.write_beside(write, engine, beside, context)

    def take_draft_stats(self):
        """Speculative bundle decoding's counts since the last call, both engines together (an
        overlap twin shares its engine's); None where the engine does not draft."""
        if not hasattr(self.engine, "take_draft_stats"):
            return None
        drafts = self.engine.take_draft_stats()
        if self.initial_engine is not None:
            drafts.add(self.initial_engine.take_draft_stats())
        return drafts


def verify(verifier, groups: Sequence[Group], candidates: Sequence[Candidates],
           transcript_chars: int) -> list[list[rubric.VerifierResult] | None]:
    """Per group, one VerifierResult per bundle (scores [N, K], NaN = unscored, and the events
    that explain each NaN); None for a group without bundles. All groups are scored concurrently."""
    todo = [i for i, c in enumerate(candidates) if c.bundles]

    async def run():
        return await asyncio.gather(*[
            verifier.ascore_many_with_events(groups[i].task.description, transcripts(groups[i], transcript_chars),
                                             candidates[i].bundles)
            for i in todo])

    out: list = [None] * len(groups)
    for i, results in zip(todo, asyncio.run(run()) if todo else []):
        out[i] = results
    return out


def select(groups: Sequence[Group], candidates: Sequence[Candidates], scores: Sequence, method: str,
           rng: np.random.Generator, min_rho: float | None = None) -> list[rubric.Alignment]:
    """B* per group: Spearman argmax (Eq. 5–7), or the ablations' random / single choice.
    `min_rho` (rubric.min_rho; None or -1: off, the paper's rule): a Spearman B* whose ρ ≤ it is set
    aside (Alignment.set_aside), so its group gets no rubric: Δ masked, e = 0."""
    from orsd.rubric.align import apply_min_rho

    threshold = None if min_rho is None or min_rho <= -1 else min_rho
    out = []
    for group, cands, results in zip(groups, candidates, scores):
        if not cands.bundles:
            out.append(rubric.Alignment(rho=[], index=None, reason=cands.reason or "no candidate bundle parsed",
                                        method=method))
            continue
        matrices = [r.scores for r in results] if results is not None else None
        out.append(apply_min_rho(rubric.select(method, matrices, np.asarray(group.rewards, dtype=float), rng=rng,
                                               num_bundles=len(cands.bundles)), threshold))
    return out


def rubric_ids(tokenizer, text: str, role: str) -> list[int] | None:
    """Token ids of the privileged rubric message, as the chat template renders it between two
    messages; None when the template does not render messages independently."""
    prefix = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    before = render(tokenizer, prefix, generation_prompt=False)
    after = render(tokenizer, prefix + [{"role": role, "content": text}], generation_prompt=False)
    return after[len(before):] if after[:len(before)] == before else None
