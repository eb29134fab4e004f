"""The warm start's content-bearing bundle demonstrations (warm_start.bundle_demos_kind=content,
orsd/train/bundle_demos.py): each is written from its own group of one shop task, names what the
task asks, shows no reward, and its criteria are met more by the group's better episodes. The
criteria are checked here by a rule reader of this file's own (`satisfied`), on the episodes'
actions and observations, not by the module's rules."""

import copy
import json
import random
import re

import pytest
from scipy.stats import spearmanr

from orsd import envs, rubric
from orsd.envs.webshop.catalog import Goal
from orsd.train.bundle_demos import content_demo, content_demos, criteria_pool, template_corpus
from orsd.train.bundles import transcripts
from orsd.train.config import load_config
from orsd.train.records import Group
from orsd.train.rollout import render
from orsd.train.warmstart import (bundle_demos_kind, bundle_demos_kind_shown, collect_bundle_demos, draft_corpus,
                                  write_record)

GROUP, CHARS, ACTIONS = 4, 700, 6  # the CPU study's group size, transcript budget and horizon


@pytest.fixture(scope="module")
def shop():
    return envs.make("webshop", max_actions=ACTIONS, results_per_page=4)


@pytest.fixture(scope="module")
def demos(shop, smol_tokenizer):
    rng = random.Random(3)
    return [content_demo(shop, smol_tokenizer, shop.sample_task(rng), GROUP, CHARS, rng, None, ACTIONS)
            for _ in range(16)]


def goal(task) -> Goal:
    return Goal.from_dict(task.payload["goal"])


def quoted(text: str) -> list[str]:
    return re.findall(r'"([^"]+)"', text)


def satisfied(criterion: str, actions: list[str], observations: list[str]) -> bool:
    """Whether an episode meets `criterion`, read from its actions and the pages they led to;
    a criterion this reader cannot decide fails the test (it would not be observable)."""
    clicks = [a[6:-1] for a in actions if a.startswith("click[")]
    searches = [a[7:-1] for a in actions if a.startswith("search[")]
    bought = "click[Buy Now]" in actions
    # the product pages opened: the observation after a click on a product id
    pages = [observations[i + 1] for i, a in enumerate(actions) if re.fullmatch(r"click\[B0\w+\]", a)]
    q, low = quoted(criterion), criterion.lower()
    if m := re.fullmatch(r'The agent searches for "(.+)" before opening any product\.', criterion):
        return bool(searches) and m[1] in searches[0]
    if criterion.startswith("The agent's search includes"):
        return any(all(x in s for x in q) for s in searches)
    if criterion.startswith("The agent does not search for"):
        return q[0] not in searches
    if m := re.fullmatch(r"The agent opens an? (.+) from the search results\.", criterion):
        return any(m[1].lower() in page.lower() for page in pages)
    if m := re.fullmatch(r"The agent does not open (B0\w+), .*", criterion):
        return m[1] not in clicks
    if m := re.fullmatch(r'On the product page the agent clicks the .+ option "(.+)"\.', criterion):
        return m[1] in clicks
    if criterion.startswith("The agent clicks Buy Now only after choosing"):
        return bought and all(v in clicks[:clicks.index("Buy Now")] for v in q)
    if m := re.fullmatch(r"The agent clicks Buy Now on the page of an? (.+)\.", criterion):
        return bought and m[1].lower() in pages[-1].lower()
    if m := re.fullmatch(r"The agent buys a product that costs less than ([\d.]+) dollars\.", criterion):
        price = re.search(r"Price: \$([\d.]+)", pages[-1]) if bought and pages else None
        return price is not None and float(price[1]) < float(m[1])
    if m := re.fullmatch(r"The agent does not open (\w+) on the product page; it clicks Buy Now\.", criterion):
        return bought and m[1] not in clicks
    if m := re.fullmatch(r"The agent buys the (.+) in at most (\d+) actions\.", criterion):
        return bought and len(actions) <= int(m[2]) and m[1].lower() in pages[-1].lower()
    raise AssertionError(f"no rule reads {criterion!r}")


def score_of(shop, task, actions) -> float:
    """The shop's own score of the episode, played again."""
    episode = shop.fork()
    episode.reset(task)
    for action in actions:
        episode.step(action)
    return episode.score


def test_a_demonstration_names_what_its_task_asks(demos):
    """5–8 criteria; most name the task's product, attributes, options or price (read from its goal);
    every quoted phrase is the task's or what an episode of the group did, never made up."""
    named = {"attribute": 0, "option": 0, "price": 0}
    for demo in demos:
        g = goal(demo.task)
        assert rubric.MIN_CRITERIA <= len(demo.criteria) <= rubric.MAX_CRITERIA
        terms = {"attribute": list(g.attributes), "option": [v for _, v in g.goal_options],
                 "price": [f"{g.price_upper:.2f}"]}
        for kind, words in terms.items():
            named[kind] += any(w in c for c in demo.criteria for w in words)
        nouns = [w.rstrip("s") for w in g.query.split() if len(w) >= 4]  # "running shoes": running, shoe
        naming = [c for c in demo.criteria if any(w in c for ws in terms.values() for w in ws)
                  or any(n in c.lower() for n in nouns)]
        assert len(naming) >= len(demo.criteria) / 2, demo.criteria
        actions = " ".join(a for e in demo.episodes for a in e.trajectory.actions)
        for phrase in (p for c in demo.criteria for p in quoted(c)):
            assert phrase in demo.task.description or phrase in actions, phrase
    assert min(named.values()) >= len(demos) / 2, named  # each kind is named in most demonstrations


def test_the_prompt_is_trainings_and_shows_no_reward(demos, smol_tokenizer):
    """The context is the bundle prompt training renders for the same episodes; it stays the same
    token for token when the episodes' rewards, scores and outcomes are changed, and nothing in it
    says which episode was better."""
    for demo in demos[:6]:
        text = smol_tokenizer.decode(demo.prompt_ids)
        trajectories = [e.trajectory for e in demo.episodes]
        expected = render(smol_tokenizer, rubric.generation_messages(
            demo.task.description, transcripts(Group(demo.task, trajectories), CHARS)))
        assert demo.prompt_ids == expected
        changed = [copy.copy(t) for t in trajectories]
        for t in changed:
            t.reward, t.score, t.won = 123.0, 0.5, not t.won
        assert render(smol_tokenizer, rubric.generation_messages(
            demo.task.description, transcripts(Group(demo.task, changed), CHARS))) == demo.prompt_ids
        assert not re.search(r"\b(rewards?|scores?d?|better|worse|best|worst|expert|success\w*|won|deviation)\b",
                             text, re.IGNORECASE), text
        for e in demo.episodes:
            assert e.deviation not in text
        assert f"{len(demo.episodes)} attempts" in text


def test_better_episodes_of_the_group_meet_more_of_its_criteria(shop, demos):
    """Read by `satisfied`: the group's best episodes meet every criterion, its worst fewer, and over
    the groups the count of criteria met rises with the shop's score."""
    rhos = []
    for demo in demos:
        met, scores = [], []
        for e in demo.episodes:
            t = e.trajectory
            met.append(sum(satisfied(c, t.actions, t.observations) for c in demo.criteria))
            scores.append(score_of(shop, demo.task, t.actions))
        assert len(set(scores)) > 1  # the group's episodes differ in outcome
        top, bottom = max(scores), min(scores)
        assert all(m == len(demo.criteria) for m, s in zip(met, scores) if s == top), (met, scores)
        assert max(m for m, s in zip(met, scores) if s == bottom) < len(demo.criteria), (met, scores)
        rhos.append(spearmanr(met, scores).statistic)
    assert sum(rhos) / len(rhos) > 0.5 and min(rhos) > 0, rhos


def test_the_groups_hold_the_expert_and_deviations_from_it(demos):
    for demo in demos:
        kinds = [e.deviation for e in demo.episodes]
        assert len(kinds) == GROUP and "expert" in kinds and len(set(kinds)) >= 3


def test_pool_demonstrations_still_draw_from_the_pool(shop, smol_tokenizer):
    pool = criteria_pool("webshop")
    made = collect_bundle_demos(shop, smol_tokenizer, 4, GROUP, CHARS, random.Random(0), None, ACTIONS, kind="pool")
    for demo in made:
        answer = smol_tokenizer.decode(demo.response_ids, skip_special_tokens=True)
        criteria = rubric.extract_criteria(answer)
        assert rubric.MIN_CRITERIA <= len(criteria) <= rubric.MAX_CRITERIA
        assert criteria == sorted(criteria, key=pool.index)  # the pool's lines, in its order
    content = collect_bundle_demos(shop, smol_tokenizer, 4, GROUP, CHARS, random.Random(0), None, ACTIONS)
    lines = [c for d in content for c in rubric.extract_criteria(smol_tokenizer.decode(d.response_ids,
                                                                                         skip_special_tokens=True))]
    assert len(lines) >= 4 * rubric.MIN_CRITERIA and not set(lines) & set(pool)
    with pytest.raises(ValueError, match="bundle_demos_kind"):
        collect_bundle_demos(shop, smol_tokenizer, 1, GROUP, CHARS, random.Random(0), kind="oracle")


def test_envs_without_a_writer_fall_back_to_the_pool():
    assert bundle_demos_kind(load_config(None, [])) == "content"
    assert bundle_demos_kind(load_config(None, ["env.name=alfworld"])) == "pool"
    assert bundle_demos_kind(load_config(None, ["warm_start.bundle_demos_kind=pool"])) == "pool"


def test_the_draft_corpus_follows_the_demonstrations_the_policy_saw(tmp_path, smol_tokenizer):
    """Content: the templates' fixed words; pool: the pool; a saved policy's record says which, and a
    record from before content demonstrations existed means the pool."""
    on = load_config(None, ["rubric.draft_tokens=8"])
    pool_on = load_config(None, ["rubric.draft_tokens=8", "warm_start.bundle_demos_kind=pool"])
    corpus = draft_corpus(on, smol_tokenizer)
    assert [smol_tokenizer.decode(ids) for ids in corpus] == template_corpus()
    assert corpus != draft_corpus(pool_on, smol_tokenizer) != []
    write_record(on, tmp_path, writes_bundles=True)
    assert json.loads((tmp_path / "warm_start.json").read_text())["bundle_demos_kind"] == "content"
    off = load_config(None, ["rubric.draft_tokens=8", "warm_start.enabled=false", f"model.path={tmp_path}"])
    assert bundle_demos_kind_shown(off) == "content" and draft_corpus(off, smol_tokenizer) == corpus
    (tmp_path / "warm_start.json").write_text(json.dumps({"env": "webshop", "bundle_demos": 12}))
    assert draft_corpus(off, smol_tokenizer) == draft_corpus(pool_on, smol_tokenizer)


def test_a_group_with_too_little_to_show_is_redrawn_then_left_to_the_pool(smol_tokenizer, monkeypatch):
    """With 2 actions the expert only searches and opens a product: many groups give fewer than 5
    criteria, and another task is drawn; after TASK_TRIES such tasks the demonstration is the pool's,
    and the log says so. Every demonstration keeps 5–8 criteria."""
    import orsd.train.bundle_demos as module

    written, lines = [], []
    monkeypatch.setattr(module, "content_demo", lambda *a: written.append(content_demo(*a)) or written[-1])
    short = envs.make("webshop", max_actions=2, results_per_page=4)
    made = content_demos(short, smol_tokenizer, 12, 3, CHARS, random.Random(0), None, 2, lines.append)
    pooled = [d for d in made if not d.episodes]
    content = [d for d in made if d.episodes]
    assert len(made) == 12 and pooled and content and len(written) > len(content) + module.TASK_TRIES
    assert all(rubric.MIN_CRITERIA <= len(d.criteria) <= rubric.MAX_CRITERIA for d in made)
    assert all(set(d.criteria) <= set(criteria_pool("webshop")) for d in pooled)
    assert lines == [f"bundle demonstrations: {len(pooled)} of 12 drawn from the criteria pool: "
                     f"{module.TASK_TRIES} tasks in a row gave too few criteria (does the expert buy within "
                     f"env.max_actions=2?)"]
