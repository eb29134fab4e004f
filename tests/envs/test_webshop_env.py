"""The shop as an environment: oracle, pages, flags, horizon, robustness and forks."""

import pickle
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orsd.envs import make
from orsd.envs.webshop.pages import SEP

GARBAGE = ["", "buy", "click", "click[", "search[]", "search[   ]", "click[]", "click[[B0]]",
           "CLICK [ buy now ]x", "go to fridge 1", "search[shoes", "]click[", "\n\t", "ж[ü]",
           "click[Buy Now] click[Buy Now]", "click[B0XXXXXXXX]"]


@pytest.fixture(scope="module")
def env():
    return make("webshop", seed=0)


def random_action(e, rng, expert=True):
    """A cheap random policy over sensible and garbage commands (and, if `expert`, sometimes
    the oracle's move, to reach deeper pages)."""
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.25:
        return rng.choice(GARBAGE)
    if roll < 0.4 and expert:
        return e.expert_action()
    available = e.available_actions()
    if available["has_search_bar"] and roll < 0.7:
        words = e.goal.instruction_text.split()
        return f"search[{' '.join(rng.sample(words, 3))}]"
    if available["clickables"]:
        return f"click[{rng.choice(available['clickables'])}]"
    return rng.choice(GARBAGE)


def run_episode(e, task, policy):
    observations = [e.reset(task)]
    actions, infos = [], []
    done = False
    while not done:
        action = policy(e)
        observation, done, info = e.step(action)
        actions.append(action)
        observations.append(observation)
        infos.append(info)
    return observations, actions, infos


def test_oracle_scores_one_on_many_tasks(env):
    tasks = env.tasks("test")[:150] + env.tasks("train")[:150]
    for task in tasks:
        e = env.fork()
        _, actions, infos = run_episode(e, task, lambda e: e.expert_action())
        assert infos[-1]["score"] == 1.0 and infos[-1]["won"], (task.id, actions)
        assert e.num_invalid == 0 and e.num_no_progress == 0
        assert len(actions) <= 10
        assert actions[0].startswith("search[") and actions[-1] == "click[Buy Now]"


def test_oracle_recovers_after_wrong_moves(env):
    rng = random.Random(1)
    wins = 0
    tasks = env.tasks("dev")[:60]
    for task in tasks:
        e = env.fork()
        e.reset(task)
        for _ in range(4):  # four random moves first, then the oracle only
            if e.done:
                break
            e.step(random_action(e, rng))
        while not e.done:
            e.step(e.expert_action())
        wins += e.won
    assert wins >= 0.9 * len(tasks)


def test_oracle_leaves_a_wrong_item(env):
    e = env.fork()
    task = env.tasks("train")[5]
    e.reset(task)
    e.step("search[wool socks]" if task.kind != "fashion" else "search[hdmi cable]")
    first = e.available_actions()["clickables"][2]  # a product that cannot be right
    e.step(f"click[{first}]")
    e.step("click[Description]")
    assert e.expert_action() == "click[< Prev]"
    e.step("click[< Prev]")
    assert e.expert_action() == "click[Back to Search]"
    while not e.done:
        e.step(e.expert_action())
    assert e.won


def test_pages_look_like_webshop_text_mode(env):
    e = env.fork()
    task = env.tasks("train")[0]
    first = e.reset(task)
    assert first == f"WebShop{SEP}Instruction:{SEP}{task.description}{SEP}Search"
    results, _, _ = e.step(e.expert_action())
    parts = results.split(SEP)
    assert parts[:3] == ["Back to Search", "Page 1 (Total results: 50)", "Next >"]
    asin, title, price = parts[3:6]
    assert asin.startswith("B0") and title == e.catalog.by_asin[asin].title
    assert price == f"${e.catalog.by_asin[asin].price:.2f}"
    assert len(parts) == 3 + 3 * 10
    e.step("click[next >]")  # case and spacing of click texts do not matter
    page_two = e.observation().split(SEP)
    assert page_two[1:4] == ["Page 2 (Total results: 50)", "< Prev", "Next >"]
    assert not e.step(f"click[{asin}]")[2]["valid_action"]  # a product of another page
    asin = page_two[4]
    e.step(f"click[{asin.lower()}]")  # product ids too
    item = e.observation().split(SEP)
    assert item[:2] == ["Back to Search", "< Prev"] and item[-4:] == [
        "Description", "Features", "Reviews", "Buy Now"]
    assert f"Price: ${e.catalog.by_asin[asin].price:.2f}" in item
    value = e.catalog.by_asin[asin].options[0][1][0]
    observation, _, info = e.step(f"click[{value}]")
    assert observation == f"You have clicked {value}." and info["valid_action"]
    description, _, _ = e.step("click[Description]")
    assert description.split(SEP)[2] == e.catalog.by_asin[asin].description


def test_invalid_actions_change_nothing():
    e = make("webshop", max_actions=50).fork()
    e.reset(e.tasks("train")[1])
    state = e.state
    for action in [None, *GARBAGE, "click[Buy Now]", "click[Next >]"]:
        observation, done, info = e.step(action)
        assert not done and info["valid_action"] is False and info["no_progress"] is False
        assert observation.startswith("Invalid action:") and "Nothing happened." in observation
        assert e.state == state
    assert e.num_invalid == e.num_actions == len(GARBAGE) + 3


def test_search_only_on_the_search_page(env):
    e = env.fork()
    e.reset(env.tasks("train")[1])
    e.step("search[shoes]")
    _, _, info = e.step("search[shirt]")
    assert not info["valid_action"]


def test_no_progress_means_a_state_seen_before(env):
    e = env.fork()
    e.reset(env.tasks("train")[2])
    flags = []
    for action in ["search[red dress]", "click[Next >]", "click[< Prev]", "click[Back to Search]",
                   "search[RED   dress]", "search[blue dress]"]:
        if action.startswith("search") and e.state.page != "search":
            e.step("click[Back to Search]")
        flags.append(e.step(action)[2]["no_progress"])
    assert flags == [False, False, True, True, True, False]
    asin = e.available_actions()["clickables"][2]
    value = e.catalog.by_asin[asin].options[0][1][0]
    steps = [f"click[{asin}]", f"click[{value}]", f"click[{value}]", "click[Reviews]",
             "click[< Prev]"]
    assert [e.step(a)[2]["no_progress"] for a in steps] == [False, False, True, False, True]


def test_horizon_ends_the_episode_with_score_zero(env):
    e = env.fork()
    e.reset(env.tasks("train")[0])
    for i in range(15):
        _, done, info = e.step("click[Back to Search]" if i % 2 else None)
        assert done == (i == 14)
    assert info["truncated"] and info["score"] == 0.0 and not info["won"] and e.num_actions == 15
    with pytest.raises(RuntimeError, match="episode is over"):
        e.step("search[x]")
    with pytest.raises(RuntimeError, match="needs an episode in progress"):
        e.expert_action()


def test_step_and_reset_errors(env):
    e = env.fork()
    with pytest.raises(RuntimeError, match="call reset"):
        e.step("search[x]")
    with pytest.raises(TypeError, match="task must be"):
        e.reset("task")
    other = make("webshop", seed=1, num_products=60)
    with pytest.raises(ValueError, match="was not made by a webshop env with catalog"):
        e.reset(other.tasks("train")[0])
    e.reset(env.tasks("train")[0])
    observation, done, info = e.step(3)  # the protocol: a bad action is flagged invalid, never raised
    assert not info["valid_action"] and not done and "must be text" in observation


def test_thousand_random_episodes_run_without_exceptions(env):
    rng = random.Random(0)
    tasks = env.tasks("train")
    pages = set()
    bought = 0
    for _ in range(1000):
        e = env.fork()
        e.reset(rng.choice(tasks))
        while not e.done:
            _, _, info = e.step(random_action(e, rng, expert=False))
            assert 0.0 <= info["score"] <= 1.0
            pages.add(info["page"])
        assert e.num_invalid + e.num_no_progress <= e.num_actions <= e.max_actions
        bought += info["purchased"] is not None
    assert pages == {"search", "results", "item", "detail", "done"} and bought > 50


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40),
                          st.text(max_size=20).map(lambda s: f"click[{s}]"),
                          st.text(max_size=20).map(lambda s: f"search[{s}]")), max_size=15))
def test_any_text_never_raises(actions):
    e = make("webshop").fork()
    e.reset(e.tasks("test")[0])
    for action in actions:
        if e.done:
            break
        e.step(action)


def test_forks_do_not_share_state(env):
    tasks = [env.tasks("train")[10], env.tasks("train")[11]]

    def policy_for(seed):
        rng = random.Random(seed)
        return lambda e: e.expert_action() if rng.random() < 0.6 else random_action(e, rng)

    alone = [run_episode(env.fork(), t, policy_for(i)) for i, t in enumerate(tasks)]
    forks = [env.fork(), env.fork()]
    assert forks[0].catalog is forks[1].catalog and forks[0].index is forks[1].index
    policies = [policy_for(0), policy_for(1)]
    traces = [([f.reset(t)], [], []) for f, t in zip(forks, tasks, strict=True)]
    while not all(f.done for f in forks):
        for f, policy, trace in zip(forks, policies, traces, strict=True):
            if not f.done:
                action = policy(f)
                observation, _, info = f.step(action)
                trace[0].append(observation)
                trace[1].append(action)
                trace[2].append(info)
    assert [tuple(map(list, t)) for t in traces] == [tuple(map(list, a)) for a in alone]


def test_tasks_and_sampling(env):
    rng = random.Random(3)
    task = env.sample_task(rng)
    assert task.split == "train" and task in env.tasks("train")
    assert env.sample_task(rng, "test").split == "test"
    assert {t.kind for t in env.tasks("train")} == {
        "beauty", "fashion", "electronics", "grocery", "home"}
    assert len({t.id for s in env.splits for t in env.tasks(s)}) == 6000
    with pytest.raises(ValueError, match="split must be one of"):
        env.tasks("valid_seen")


def test_admissible_actions_listing():
    plain = make("webshop").fork()
    plain.reset(plain.tasks("train")[0])
    assert plain.admissible_actions() is None
    listed = make("webshop", list_admissible=True).fork()
    listed.reset(listed.tasks("train")[0])
    assert listed.admissible_actions() == ["search[<query>]"]
    listed.step(listed.expert_action())
    admissible = listed.admissible_actions()
    assert admissible[:2] == ["click[Back to Search]", "click[Next >]"] and len(admissible) == 12
    assert listed.expert_action() in admissible


def test_forks_run_in_threads_like_alone(env):
    tasks = env.tasks("dev")[:24]

    def play(task):
        rng = random.Random(task.id)
        return run_episode(env.fork(), task, lambda e: random_action(e, rng))

    alone = [play(t) for t in tasks]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(play, tasks))
    assert threaded == alone


def test_env_pickles_for_worker_processes(env):
    copy = pickle.loads(pickle.dumps(env.fork()))
    task = env.tasks("test")[7]
    assert run_episode(copy, task, lambda e: e.expert_action())[2][-1]["won"]
