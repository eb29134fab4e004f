"""Control bundles for a calibrated Δ: an extension beyond the paper (docs/training.md, docs/evidence.md).

The paper's Δ = lp(response | context + B*) − lp(response | context) measures two things at once:
what B* says, and that a block of rubric-shaped text sits in the context at all. On the
warm-started SmolLM2 the second dominates (issue 60's probe: any rubric flattens the policy, the
first answer token gets Δ ≈ −6 under every rubric). A control bundle has B*'s form — the same
template, the same number of numbered criteria of similar length, spliced at the same slot, and
(orsd/train/delta.py) exactly as many tokens, cut or padded with `filler` — but not its content,
so Δ_control = lp(· | context + B*) − lp(· | context + control) keeps what B* says and cancels
what its presence does.

Controls (`rubric.delta_baseline`):
- `content_free`: criteria that name nothing about any task ("The attempt is described in the
  transcript."), one per criterion of B*, chosen by length;
- `rejected`: the group's lowest-ρ candidate bundle that was not selected (the policy's own
  writing, the same task, the weakest alignment with the rewards); no control where the group has
  no second bundle;
- `shuffled`: B*'s criteria replaced by criteria of other tasks' bundles of the same step (the
  same writer and style, another task's content); no control where the step has no other bundle.

Nothing here reads a model or the trainer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from orsd.rubric.bundle import RubricBundle

#: rubric.delta_baseline's values; "none" is the paper's Δ (the plain context is the baseline)
CONTROLS = ("none", "content_free", "rejected", "shuffled")

# Sentences of a criterion's form (an observable statement about "the agent"/"the attempt") that
# no trajectory can satisfy or violate more than another: they carry the rubric's shape without
# its content. Lengths 7-20 words, so a bundle of any criteria lengths finds near matches.
CONTENT_FREE_CRITERIA = (
    "The attempt is described in the transcript.",
    "The transcript shows the steps of the attempt in order.",
    "Each turn of the attempt consists of an observation followed by a reply.",
    "The attempt takes place in the environment described at the start of the transcript.",
    "The replies of the agent are written in English, one reply for each turn of the attempt.",
    "The transcript records what the agent wrote and what the environment answered at every single turn.",
    "The attempt begins with the first observation and continues until the episode is over.",
    "Every observation in the transcript comes from the same environment and the same episode.",
    "The agent is the one who writes the replies that appear in the transcript of this attempt, turn after turn.",
    "The transcript can be read from its first line to its last line without skipping any of the turns.",
)


def content_free_bundle(like: RubricBundle) -> RubricBundle:
    """A bundle of `len(like)` content-free criteria, each the unused one closest in word count to
    the criterion of `like` at its position (so the control's token length tracks B*'s)."""
    pool = list(CONTENT_FREE_CRITERIA)
    criteria = []
    for text in like.criteria:
        words = len(text.split())
        best = min(pool, key=lambda c: (abs(len(c.split()) - words), pool.index(c)))
        pool.remove(best)
        criteria.append(best)
        if not pool:  # more criteria than sentences (MAX_CRITERIA is 8, the pool 10): start over
            pool = list(CONTENT_FREE_CRITERIA)
    return RubricBundle(criteria=criteria, source="control:content_free")


def rejected_bundle(bundles: Sequence[RubricBundle], rho: Sequence[float | None], selected: int) -> RubricBundle | None:
    """The candidate with the lowest finite ρ other than B* (index `selected`): the same task, the
    same writer, the weakest alignment with the rewards. Where no other candidate has a finite ρ
    (the ablations that skip the verifier record none), the first other candidate; None when B* is
    the only candidate (single_bundle, offline_rubric, static_rubric: no control, e = 0)."""
    others = [i for i in range(len(bundles)) if i != selected]
    if not others:
        return None

    def rank(i: int) -> tuple[int, float]:
        value = rho[i] if i < len(rho) else None
        finite = value is not None and value == value
        return (0, float(value)) if finite else (1, 0.0)

    chosen = min(others, key=rank)
    bundle = bundles[chosen]
    return RubricBundle(criteria=list(bundle.criteria), raw_text=bundle.raw_text, source="control:rejected",
                        num_found=bundle.num_found)


def shuffled_bundle(selected: RubricBundle, others: Sequence[RubricBundle], rng: random.Random) -> RubricBundle | None:
    """`len(selected)` criteria drawn without replacement from `others` (other tasks' bundles),
    cycling when they hold fewer; a criterion that B* itself holds is never drawn (one rubric file
    for every task would otherwise give B* back, reordered); None when no criterion is left."""
    own = set(selected.criteria)
    pool = [c for bundle in others for c in bundle.criteria if c not in own]
    if not pool:
        return None
    criteria: list[str] = []
    while len(criteria) < len(selected):
        batch = list(pool)
        rng.shuffle(batch)
        criteria.extend(batch[:len(selected) - len(criteria)])
    return RubricBundle(criteria=criteria, source="control:shuffled")


def filler(count: int) -> str:
    """`count` content-free sentences (cycling), space-separated: what pads a control that is
    shorter than B* to B*'s token count (train/delta.py), text that has the rubric's register but
    says nothing about any task."""
    return " ".join(CONTENT_FREE_CRITERIA[i % len(CONTENT_FREE_CRITERIA)] for i in range(count))
