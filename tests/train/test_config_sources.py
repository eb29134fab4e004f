"""Where a refused value came from: a renamed key written on the command line is blamed there and
by the name the user wrote (not on the embedded default, where the new key last had a value), and
a YAML file that writes a key twice is refused with both lines (issue 58)."""

import warnings

import pytest

from orsd.train.cli import main
from orsd.train.config import ConfigError, load_config


def refused(path=None, overrides=()) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the rename's own warning: tested in test_config.py
        with pytest.raises(ConfigError) as caught:
            load_config(path, list(overrides))
    return str(caught.value)


def test_a_renamed_key_on_the_command_line_is_blamed_on_the_command_line():
    # was: "orsd/train/default.yaml:6: method.name='bogus' is invalid"
    message = refused(overrides=["rubric.mode=bogus"])
    assert message.startswith("command line, key 'rubric.mode' (now 'method.name'): method.name='bogus' is invalid")
    assert "default.yaml" not in message


def test_a_renamed_key_in_a_file_is_blamed_on_its_line(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("env: {name: webshop}\nverifier:\n  mode: sometimes\n")
    assert refused(path).startswith(f"{path}:3, key 'verifier.mode' (now 'verifier.granularity'): "
                                    "verifier.granularity='sometimes' is invalid")


def test_a_renamed_key_of_the_wrong_type_names_where_it_was_written():
    assert refused(overrides=["rubric.mode=[1, 2]"]).startswith("command line, key 'rubric.mode' (now 'method.name')")


def test_orsd_train_reports_it_in_one_line_with_exit_code_2(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert main(["rubric.mode=bogus", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("orsd-train: config error: command line, key 'rubric.mode'") and "\n" not in err


@pytest.mark.parametrize("text, dotted, lines", [
    ("optim:\n  lr: 1.0e-5\n  kl_coef: 0.1\n  lr: 3.0e-5\n", "optim.lr", (2, 4)),
    ("optim: {lr: 1.0}\nenv: {name: webshop}\noptim: {kl_coef: 0.1}\n", "optim", (1, 3)),
    ("env:\n  options: {results_per_page: 4, results_per_page: 5}\n", "env.options.results_per_page", (2, 2)),
])
def test_a_key_written_twice_is_refused_with_the_file_and_both_lines(tmp_path, text, dotted, lines):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    first, second = lines
    assert refused(path) == (f"{path}:{second}: key {dotted!r} is written twice, on lines {first} and {second} "
                             "(YAML would keep the last silently); keep one")


def test_the_same_key_in_two_sections_and_an_explicit_key_over_a_merge_are_fine(tmp_path):
    path = tmp_path / "fine.yaml"
    path.write_text("rollout: &sampling {temperature: 0.9, top_p: 0.8}\nrubric:\n  <<: *sampling\n  temperature: 0.3\n")
    config = load_config(path)
    assert (config.rollout.temperature, config.rubric.temperature, config.rubric.top_p) == (0.9, 0.3, 0.8)
