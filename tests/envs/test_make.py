"""orsd.envs.make: names, splits, options and the errors it gives."""

import importlib.util

import pytest

from orsd.envs import INFO_KEYS, SPLITS, Env, make
from orsd.envs.webshop import WebShopEnv


def test_make_webshop_every_split():
    for split in ("train", "dev", "test"):
        env = make("webshop", split=split, seed=0)
        assert isinstance(env, WebShopEnv) and isinstance(env, Env)
        assert env.name == "webshop" and env.split == split and env.max_actions == 15
        assert env.splits == SPLITS["webshop"]


def test_make_passes_options():
    env = make("webshop", seed=0, max_actions=7, results_per_page=5)
    assert env.max_actions == 7 and env.results_per_page == 5


@pytest.mark.parametrize("name", ["web_shop", "ALFWorld", "", "sokoban"])
def test_make_unknown_name(name):
    expected = r"unknown environment name=.*expected one of \['alfworld', 'webshop'\]"
    with pytest.raises(ValueError, match=expected):
        make(name)


@pytest.mark.parametrize(
    "name, split, valid",
    [
        ("webshop", "valid_seen", "\\['train', 'dev', 'test'\\]"),
        ("webshop", "eval", "\\['train', 'dev', 'test'\\]"),
        ("alfworld", "dev", "\\['train', 'valid_seen', 'valid_unseen'\\]"),
        ("alfworld", "test", "\\['train', 'valid_seen', 'valid_unseen'\\]"),
    ],
)
def test_make_unknown_split_names_valid_ones(name, split, valid):
    expected = f"unknown split='{split}' for environment '{name}'; expected one of {valid}"
    with pytest.raises(ValueError, match=expected):
        make(name, split=split)


def test_make_bad_options():
    with pytest.raises(ValueError, match="unknown webshop backend='fake'"):
        make("webshop", backend="fake")
    with pytest.raises(TypeError):
        make("webshop", no_such_option=1)
    with pytest.raises(TypeError, match="seed must be an int"):
        make("webshop", seed="0")
    with pytest.raises(ValueError, match="max_actions must be a positive int"):
        make("webshop", max_actions=0)
    with pytest.raises(ValueError, match="num_products must be an int >= 30"):
        make("webshop", num_products=10)


@pytest.mark.skipif(importlib.util.find_spec("web_agent_site") is not None,
                    reason="WebShop is installed here")
def test_real_backend_without_webshop_installed_is_a_clear_error():
    with pytest.raises(ImportError, match="needs WebShop installed"):
        make("webshop", backend="real")


def test_info_keys_on_every_step():
    env = make("webshop").fork()
    env.reset(env.tasks("dev")[0])
    for action in (None, "search[shoes]", "click[nonsense]"):
        _, _, info = env.step(action)
        assert set(INFO_KEYS) <= set(info)
