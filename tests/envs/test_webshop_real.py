"""The real-WebShop adapter's own logic, against a fake with WebShop's text-env interface.

WebShop itself is not installed here; these tests check validation, flags, horizon, splits and
forking of the adapter only.
"""

import pytest

from orsd.envs import make
from orsd.envs.rewards import episode_reward
from orsd.envs.webshop.real import WebShopRealEnv


class FakeServer:
    def __init__(self):
        self.goals = [{"instruction_text": f"goal {i}", "category": "beauty"} for i in range(1600)]


class FakeWebShop:
    """A two-page WebShop: search page -> results -> item -> buy (reward 0.75)."""

    made = []

    def __init__(self, server=None, **kwargs):
        self.server = server or FakeServer()
        self.kwargs = kwargs
        self.page = None
        self.sent = []
        FakeWebShop.made.append(self)

    def reset(self, session):
        self.page, self.session = "search", session
        return f"WebShop [SEP] Instruction: [SEP] goal {session} [SEP] Search", None

    def get_available_actions(self):
        clickables = {"search": [], "results": ["back to search", "b0abc12345"],
                      "item": ["back to search", "< prev", "buy now"]}[self.page]
        return {"has_search_bar": self.page == "search", "clickables": clickables}

    def step(self, action):
        self.sent.append(action)
        if action.startswith("search["):
            self.page = "results"
        elif action == "click[b0abc12345]":
            self.page = "item"
        elif action == "click[back to search]":
            self.page = "search"
        elif action == "click[buy now]":
            return "Your score (min 0.0, max 1.0) [SEP] 0.75", 0.75, True, None
        if self.page == "search":
            return self.reset(self.session)[0], 0.0, False, None
        return f"page {self.page}", 0.0, False, None


def make_real(**kwargs):
    return WebShopRealEnv("dev", env_factory=FakeWebShop, **kwargs)


def test_splits_follow_webshop_convention():
    env = make_real()
    assert [len(env.tasks(s)) for s in ("test", "dev", "train")] == [500, 1000, 100]
    assert env.tasks("dev")[0].payload == {"goal_index": 500}
    assert env.tasks("test")[3].description == "goal 3"
    with pytest.raises(ValueError, match="split must be one of"):
        env.tasks("valid_seen")


def test_episode_flags_score_and_reward():
    env = make_real()
    env.reset(env.tasks("test")[0])
    steps = [None, "click[nothing]", "search[shoes]", "search[again]", "click[B0ABC12345]",
             "click[Back to Search]", "search[shoes]", "click[b0abc12345]", "click[Buy  Now]"]
    infos = [env.step(a)[2] for a in steps]
    assert [i["valid_action"] for i in infos] == [False, False, True, False, True, True, True,
                                                 True, True]
    # a page whose text was seen before in the episode counts as no progress
    assert [i["no_progress"] for i in infos] == [False] * 5 + [True, True, True, False]
    fake = env._env
    assert fake.sent[-1] == "click[buy now]"  # clicks are sent as WebShop spells them
    assert env.done and infos[-1]["score"] == 0.75 and not infos[-1]["won"]
    assert "score" not in env.observation_text.lower()  # the end page hides the score
    assert episode_reward(env) == pytest.approx(0.375 - 0.05 * 3 / 9 - 0.025 * 3 / 9)


def test_horizon_and_errors():
    env = make_real(max_actions=3)
    with pytest.raises(RuntimeError):
        env.step("search[x]")
    env.reset(env.tasks("train")[0])
    for _ in range(3):
        _, done, info = env.step("look")
    assert done and info["truncated"] and info["score"] == 0.0
    with pytest.raises(NotImplementedError, match="no oracle"):
        env.expert_action()
    with pytest.raises(ValueError, match="goal_index"):
        env.reset(make("webshop").tasks("train")[0])


def test_fork_shares_the_server_not_the_session():
    env = make_real()
    fork = env.fork()
    assert fork._env is not env._env and fork._env.server is env._env.server
    env.reset(env.tasks("test")[0])
    fork.reset(fork.tasks("test")[1])
    env.step("search[a]")
    assert fork._env.page == "search" and env._env.page == "results"


def test_make_routes_the_real_backend():
    env = make("webshop", split="test", backend="real", env_factory=FakeWebShop)
    assert isinstance(env, WebShopRealEnv) and env.split == "test"
