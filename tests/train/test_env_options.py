"""env.options checked against env.name's constructor before anything is built, and the embedded
default's env-specific layer: `orsd-train env.name=alfworld` died with a TypeError deep in the
warm start's child (the shop's results_per_page reached AlfworldEnv), and once past that, the shop's
5-action horizon failed every ALFWorld episode (issue 58)."""

import pytest

from orsd.envs import make, option_names
from orsd.train.cli import main
from orsd.train.config import ConfigError, load_config


def test_alfworld_on_the_embedded_default_drops_the_shops_options_and_horizon():
    config = load_config(None, ["env.name=alfworld"])
    assert "results_per_page" not in config.env.options
    assert config.env.options["split_sizes"] == {"train": 24, "valid_seen": 12, "valid_unseen": 12}
    assert config.env.max_actions == 15  # the planner's plans take 3.9-8.6 actions; 5 failed every episode
    assert load_config(None, ["env={name: alfworld}"]) == config  # either way of writing it
    assert config.method.name == "orsd" and config.warm_start.enabled  # the rest is the embedded default's


def test_the_command_line_still_wins_over_the_env_layer():
    config = load_config(None, ["env.max_actions=30", "env.name=alfworld", "env.options={split_sizes: {train: 6}}"])
    assert config.env.max_actions == 30 and config.env.options == {"split_sizes": {"train": 6}}


def test_the_shop_keeps_the_embedded_default_and_a_file_is_read_as_written(tmp_path):
    assert load_config(None, ["env.name=webshop"]) == load_config()
    path = tmp_path / "alfworld.yaml"
    path.write_text("env:\n  name: alfworld\n")
    assert load_config(path, ["env.name=alfworld"]).env.max_actions == 0  # no env layer: the file's own


@pytest.mark.parametrize("overrides, option", [
    (["env.name=alfworld", "env.options={results_per_page: 4}"], "results_per_page"),
    (["env.options={split_sizes: {train: 6}}"], "split_sizes"),  # an ALFWorld option under the shop
    (["env.options={backend: real, results_per_page: 4}"], "results_per_page"),  # not the real shop's
])
def test_an_option_of_another_env_is_a_one_line_error_naming_it_and_the_env(overrides, option, capsys):
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    name = load_config(None, overrides[:1]).env.name if "env.name" in overrides[0] else "webshop"
    message = str(caught.value)
    assert f"expected options of env.name={name}: " in message and f"({option!r} is not one)" in message
    assert main([*overrides, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("orsd-train: config error: command line: env.options=") and "\n" not in err


def test_a_file_that_sets_the_shops_option_under_alfworld_names_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  name: alfworld\n  options:\n    results_per_page: 4\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: env.options=\{{'results_per_page': 4\}} is invalid"):
        load_config(path)


def test_an_unknown_shop_backend_is_refused_by_the_config_and_by_make():
    with pytest.raises(ConfigError, match="env.options=.*expected the webshop backend 'generated' or 'real'"):
        load_config(None, ["env.options={backend: remote}"])
    with pytest.raises(ValueError, match="unknown webshop backend='remote'"):
        make("webshop", backend="remote")


def test_option_names_are_what_each_constructor_takes():
    assert option_names("alfworld") == ("max_actions", "split_sizes", "cache_dir", "num_workers", "data_dir", "source")
    assert option_names("webshop") == ("num_products", "goals_per_product", "max_actions", "results_per_page",
                                       "list_admissible", "backend")
    assert "human_goals" in option_names("webshop", "real") and "results_per_page" not in option_names("webshop", "real")
