"""The benchmark scripts' command lines: `--help` and a bad option are answered before anything is
built (they used to reach load_config, which refused `--help` as a malformed override after the
imports), and options and config overrides may come in any order."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

# script -> the function main() calls first with the overrides (patched: nothing may be built)
SCRIPTS = {"step": "load_config", "default_run": "run"}


class Reached(Exception):
    """main() got past its command line."""


@pytest.fixture
def script(request, monkeypatch):
    """The benchmark module, its first step after parsing patched to raise Reached with its arguments.
    Importing some scripts sets OMP_WAIT_POLICY (for the threads of a real run); monkeypatch puts
    back what it was."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    module = importlib.import_module(request.param)

    def reached(*args, **kwargs):
        raise Reached(args)

    monkeypatch.setattr(module, SCRIPTS[request.param], reached)
    return module


@pytest.mark.parametrize("script", sorted(SCRIPTS), indirect=True)
def test_help_prints_the_docstring_and_builds_nothing(script, capsys):
    with pytest.raises(SystemExit) as stopped:
        script.main(["--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "section.key=value" in out
    assert script.__doc__.splitlines()[0] in out


@pytest.mark.parametrize("script", ["step"], indirect=True)
@pytest.mark.parametrize("rounds", ["0", "-1", "two"])
def test_a_bad_rounds_is_refused_naming_the_option(script, rounds, capsys):
    with pytest.raises(SystemExit) as stopped:
        script.main(["--rounds", rounds])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--rounds" in err and "integer >= 1" in err and repr(rounds) in err


# each script's own options, to mix with the overrides
OPTIONS = {"step": ["--rounds", "3", "--flops"], "default_run": ["--run-dir", "/tmp/x"]}


@pytest.mark.parametrize("script", sorted(SCRIPTS), indirect=True)
def test_overrides_before_between_and_after_the_options(script):
    options = OPTIONS[script.__name__]
    half = len(options) // 2 // 2 * 2  # the overrides go around whole option pairs
    argv = ["model.autocast=", *options[:half], "rubric.num_bundles=2", *options[half:], "env.max_turns=3"]
    with pytest.raises(Reached) as reached:
        script.main(argv)
    assert reached.value.args[0][-1][-3:] == ["model.autocast=", "rubric.num_bundles=2", "env.max_turns=3"]


def test_default_run_removes_its_scratch_directory_and_keeps_a_given_one(tmp_path, monkeypatch):
    """The default job's run directory holds ~1.4 GB of checkpoints: a scratch one under /tmp goes
    once run() has read its figures; one given with --run-dir stays."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    module = importlib.import_module("default_run")
    seen = []

    def run(run_dir, overrides):
        (run_dir / "checkpoints").mkdir()
        seen.append(run_dir)
        return {"overrides": overrides}

    monkeypatch.setattr(module, "run", run)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    assert module.main(["model.autocast="]) == {"overrides": ["model.autocast="]}
    assert seen[0].name.startswith("orsd-default-") and not seen[0].exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    module.main(["--run-dir", str(kept)])
    assert seen[1] == kept and (kept / "checkpoints").is_dir()
