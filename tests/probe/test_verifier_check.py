"""The verifier check (orsd/probe/truth.py, verifier_check.py): the rules on hand-built shop episodes,
the corrupted episodes' coverage, and the AUCs of scripted verifiers scored through training's own
`bundles.verify` on real env episodes: one that returns the truth gives 1, a constant one 0.5, a
reversed one 0."""

import re

import numpy as np
import pytest

from orsd import envs, rubric
from orsd.envs.webshop.oracle import oracle_rubric
from orsd.probe import truth as rules
from orsd.probe.verifier_check import (VARIANTS, Cells, Variant, check_variant, lost_an_action, paired_difference,
                                        score)
from orsd.rubric.accounting import Accounting
from orsd.rubric.controls import CONTENT_FREE_CRITERIA
from orsd.rubric.prompts import PromptTemplates
from orsd.rubric.verifier import VerifierBase, VerifierResult
from orsd.train.evaluate import eval_tasks

CHARS = 700  # configs/cpu_study.yaml's rubric.transcript_chars


@pytest.fixture(scope="module")
def shop():
    """The held-out shop as configs/cpu_study.yaml builds it (4 results a page, 6 actions)."""
    return envs.make("webshop", split="test", seed=0, results_per_page=4, max_actions=6)


@pytest.fixture(scope="module")
def cells(shop):
    tasks = eval_tasks(shop, "test", 12)
    return Cells.build(shop, tasks, [rules.task_episodes(shop, task, 0) for task in tasks])


class ScriptedVerifier(VerifierBase):
    """A test fake verifier: scores a (transcript, criterion) cell with `judge(task, transcript,
    criterion)`, so a test decides what the verifier knows."""

    def __init__(self, judge):
        self.judge = judge
        self.accounting = Accounting()
        self.templates = PromptTemplates()

    async def ascore_with_events(self, task, transcripts, bundle, bundle_index=None):
        scores = np.array([[self.judge(task, t, c) for c in bundle.criteria] for t in transcripts], float)
        return VerifierResult(scores, [])


def truth_lookup(cells: Cells, variant: Variant) -> dict:
    """(task, transcript as the variant shows it, criterion) -> the rule's truth (None: undecided)."""
    table = {}
    for task, crits, eps, truths in zip(cells.tasks, cells.criteria, cells.episodes, cells.truth):
        for episode, row in zip(eps, [*truths, [np.nan] * len(crits)]):  # the empty transcript: undecided
            text = rubric.format_transcript(episode.observations, episode.actions, variant.chars or CHARS,
                                            keep_actions=variant.keep_actions)
            for criterion, value in zip(crits, row):
                table[(task.description, text, criterion.text)] = None if np.isnan(value) else bool(value)
    return table


def truth_columns(cells: Cells) -> list:
    """Per (task, criterion) the decided truths of its episodes."""
    return [col[~np.isnan(col)] for table in cells.truth for col in table.T if (~np.isnan(col)).any()]


def known_truth(table: dict, task: str, transcript: str, criterion: str):
    """The truth of a cell (a KeyError: the verifier was shown another transcript); a content-free
    control criterion has none."""
    return None if criterion in CONTENT_FREE_CRITERIA else table[(task, transcript, criterion)]


def hand_episode(shop, task_id: str, actions: list) -> rules.Episode:
    task = next(t for t in shop.tasks("test") if t.id == task_id)
    return rules.play(shop, task, actions, "hand")


def price_on_item_page(observation: str) -> float:
    return float(re.search(r"Price: \$([0-9.]+)", observation).group(1))


TOOTHBRUSH = "webshop-s0-test-00272"  # a soft bristles electric toothbrush, color pink, under $70.00


def decided(shop, episode) -> dict:
    return {c.kind: rules.truth(c, episode, shop.catalog) for c in rules.oracle_criteria(episode.task)}


def test_rules_decide_hand_built_episodes(shop):
    search = "search[soft bristles electric toothbrush]"
    right = hand_episode(shop, TOOTHBRUSH, [search, "click[B0S2FZQREG]", "click[pink]", "click[Buy Now]"])
    assert "Instruction: [SEP] i am looking for a soft bristles electric toothbrush with color: pink, and price " \
           "lower than 70.00 dollars" in right.observations[0]
    assert "Electric Toothbrush - Soft Bristles" in right.observations[2]
    assert price_on_item_page(right.observations[2]) < 70
    assert decided(shop, right) == dict(search=True, product=True, option=True, price=True, buy=True)

    dear = hand_episode(shop, TOOTHBRUSH, [search, "click[B074KK4AUK]", "click[pink]", "click[Buy Now]"])
    assert "Electric Toothbrush - Soft Bristles" in dear.observations[2]
    assert price_on_item_page(dear.observations[2]) > 70
    assert decided(shop, dear) == dict(search=True, product=True, option=True, price=False, buy=True)

    skipped = hand_episode(shop, TOOTHBRUSH, [search, "click[B0S2FZQREG]", "click[Buy Now]"])
    assert decided(shop, skipped) == dict(search=True, product=True, option=False, price=True, buy=False)

    other_color = hand_episode(shop, TOOTHBRUSH, [search, "click[B0S2FZQREG]", "click[blue]", "click[Buy Now]"])
    assert "You have clicked blue." in other_color.observations[3]
    assert decided(shop, other_color) == dict(search=True, product=True, option=False, price=True, buy=False)

    no_buy = hand_episode(shop, TOOTHBRUSH, [search, "click[B0S2FZQREG]", "click[pink]"])
    assert decided(shop, no_buy) == dict(search=True, product=True, option=True, price=None, buy=False)

    oil = hand_episode(shop, TOOTHBRUSH, ["search[non gmo extra virgin olive oil]", "click[B05MC5EPWA]",
                                          "click[Buy Now]"])
    assert "Olive Oil" in oil.observations[2] and "Toothbrush" not in oil.observations[1]
    cheap = price_on_item_page(oil.observations[2]) <= 70
    assert decided(shop, oil) == dict(search=False, product=False, option=False, price=cheap, buy=False)

    nothing = hand_episode(shop, TOOTHBRUSH, [None, "click[Buy Now]", "search[]"])
    assert all("Invalid action" in o for o in nothing.observations[1:])
    assert decided(shop, nothing) == dict(search=False, product=False, option=False, price=None, buy=False)


def test_oracle_criteria_follow_oracle_rubric_and_a_goal_without_options_has_an_undecided_filler(shop):
    task = next(t for t in shop.tasks("test") if t.id == "webshop-s0-test-00048")  # two options
    criteria = rules.oracle_criteria(task)
    assert [c.text for c in criteria] == oracle_rubric(task)
    assert [c.kind for c in criteria] == ["search", "product", "option", "option", "price", "buy"]
    assert [c.value for c in criteria if c.kind == "option"] == ["jalapeno", "5 oz"]
    bare = type(task)(id=task.id, split=task.split, description=task.description, kind=task.kind,
                      payload={**task.payload, "goal": {**task.payload["goal"], "goal_options": []}})
    kinds = [c.kind for c in rules.oracle_criteria(bare)]
    assert kinds == ["search", "product", "title", "price", "buy"]
    episode = rules.play(shop, bare, rules.expert_actions(shop, bare), "expert")
    assert rules.truth(rules.oracle_criteria(bare)[2], episode, shop.catalog) is None


def test_expert_satisfies_every_criterion_and_corruptions_give_each_kind_both_classes(cells):
    names = [e.name for eps in cells.episodes for e in eps]
    assert names.count("expert") == names.count("empty") == 12
    for name in rules.CORRUPTIONS:
        assert names.count(name) >= 10, name
    for eps, table in zip(cells.episodes, cells.truth):
        assert eps[0].name == "expert" and eps[0].score == 1.0
        assert np.all(table[0] == 1)  # every criterion decided and satisfied
        for row in table[1:]:
            assert np.nanmin(row) == 0  # every corruption breaks some criterion
    for kind in rules.KINDS:
        values = [v for crits, table in zip(cells.criteria, cells.truth) for row in table
                  for c, v in zip(crits, row) if c.kind == kind and not np.isnan(v)]
        assert 0 < sum(values) < len(values), kind


@pytest.mark.parametrize("variant", ["training", "actions_kept"])
@pytest.mark.parametrize("who, expected", [("truthful", 1.0), ("constant", 0.5), ("reversed", 0.0)])
def test_auc_of_scripted_verifiers_through_the_scoring_path(cells, variant, who, expected):
    table = truth_lookup(cells, VARIANTS[variant])

    def judge(task, transcript, criterion):
        known = known_truth(table, task, transcript, criterion)
        if who == "constant" or known is None:
            return 0.7
        return float(known) if who == "truthful" else 1.0 - float(known)

    result = check_variant(ScriptedVerifier(judge), cells, VARIANTS[variant], CHARS, seed=0)
    f = result["figures"]
    figures = [f["auc"], f["auc_within_task_and_criterion"], *f["auc_by_kind"].values(),
               *f["auc_within_by_kind"].values()]
    for figure in figures:
        assert figure["value"] == expected and figure["ci"] == [expected, expected]
    assert f["auc_within_task_and_criterion"]["pairs"] >= 12 * 5
    if who != "constant":
        assert f["mean_satisfied"]["value"] == expected and f["mean_unsatisfied"]["value"] == 1 - expected
    assert result["figures_calibrated"]["auc_within_task_and_criterion"]["value"] == expected
    assert f["spread"]["sd_within_task_and_criterion"] == (0 if who == "constant" else pytest.approx(
        np.mean([np.std(row) for row in truth_columns(cells)])))


def test_the_interval_resamples_tasks(cells):
    """A verifier right on half the tasks and reversed on the other half: within a task and
    criterion the AUC is 0.5, and its interval is as wide as 12 units allow (resampling the ~60
    (task, criterion) pairs instead would give one about half as wide)."""
    table = truth_lookup(cells, VARIANTS["training"])
    flipped = {t.description for t in cells.tasks[::2]}

    def judge(task, transcript, criterion):
        known = known_truth(table, task, transcript, criterion)
        return 0.5 if known is None else float(known) if task not in flipped else 1.0 - float(known)

    f = check_variant(ScriptedVerifier(judge), cells, VARIANTS["training"], CHARS, seed=0)["figures"]
    within = f["auc_within_task_and_criterion"]
    assert abs(within["value"] - 0.5) < 0.05
    low, high = within["ci"]
    assert low < 0.3 and high > 0.7


def test_training_path_and_direct_path_score_alike(cells):
    """`training` goes through bundles.verify, the other variants call the verifier directly: with
    the same transcripts the two give the same scores."""
    def judge(task, transcript, criterion):
        return (hash((task, transcript, criterion)) % 1000) / 1000

    verifier = ScriptedVerifier(judge)
    through_verify = score(verifier, cells, VARIANTS["training"], CHARS)
    direct = score(verifier, cells, Variant("direct", "training's transcripts, scored directly", chars=CHARS), CHARS)
    for scores, same in zip(through_verify, direct):  # the oracle's scores, then the content-free control's
        assert all(np.array_equal(a, b) for a, b in zip(scores, same))
        assert [a.shape for a in scores] == [(len(e), len(c)) for e, c in zip(cells.episodes, cells.criteria)]
    assert not np.array_equal(through_verify[0][0], through_verify[1][0])  # the control criteria are others


def test_the_middle_cut_loses_actions_and_the_kept_window_does_not(cells):
    episodes = [e for eps in cells.episodes for e in eps[:-1]]
    middle = [rubric.format_transcript(e.observations, e.actions, CHARS) for e in episodes]
    kept = [rubric.format_transcript(e.observations, e.actions, CHARS, keep_actions=True) for e in episodes]
    assert sum(lost_an_action(e, t) for e, t in zip(episodes, middle)) > len(episodes) // 2
    assert not any(lost_an_action(e, t) for e, t in zip(episodes, kept))
    assert all(len(t) <= CHARS for t in kept + middle)
    whole = [rubric.format_transcript(e.observations, e.actions, None) for e in episodes]
    assert all(k == w for k, w in zip(kept, whole) if len(w) <= CHARS)
    assert any(rubric.transcript.OBSERVATION_CUT in t for t in kept)


def test_keep_actions_window_shares_the_room_fairly_and_falls_back_when_actions_alone_do_not_fit():
    observations = ["first page " * 3, "x" * 400, "short", "y" * 400]
    actions = ["search[a]", "click[b]", "click[c]"]
    text = rubric.format_transcript(observations, actions, 300, keep_actions=True)
    assert len(text) <= 300 and all(f"Action {t + 1}: {a}" in text for t, a in enumerate(actions))
    assert "Observation 2: short\n" in text  # a short observation stays whole
    longs = [line for line in text.split("\n") if line.startswith(("Observation 1:", "Observation 3:"))]
    assert len(longs[0]) == len(longs[1]) and rubric.transcript.OBSERVATION_CUT in longs[0]
    many = [f"click[a very long button label number {i}]" for i in range(20)]
    squeezed = rubric.format_transcript(["o"] * 21, many, 300, keep_actions=True)
    assert len(squeezed) <= 300 and "characters omitted" in squeezed


def test_paired_difference_between_variants(cells):
    """A reversed verifier against a truthful one on the same cells: −1 on every (task, criterion)."""
    table = truth_lookup(cells, VARIANTS["training"])

    def make(flip: bool):
        def judge(task, transcript, criterion):
            known = known_truth(table, task, transcript, criterion)
            return 0.5 if known is None else abs(float(known) - flip)
        return ScriptedVerifier(judge)

    truthful, reversed_ = (check_variant(make(flip), cells, VARIANTS["training"], CHARS, seed=0)["figures"]
                           ["auc_within_task_and_criterion"] for flip in (False, True))
    difference = paired_difference(reversed_, truthful, len(cells.tasks), seed=0)
    assert difference["value"] == -1.0 and difference["ci"] == [-1.0, -1.0] and difference["n"] == truthful["pairs"]
