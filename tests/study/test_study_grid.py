"""orsd-study's grid: arm and seed parsing with one-line errors, the plan (one initial policy, every
run pointed at it), each run's state from its directory, and the commands that skip, resume or start it."""

import json
from pathlib import Path

import pytest
import yaml

from orsd.study import cli
from orsd.study.grid import (Arm, StudyError, parse_arm, parse_arms, parse_overrides, parse_seeds, split_overrides,
                             state, train_command)
from orsd.study.plan import make_plan, pinned_precision, run_overrides

ROOT = Path(__file__).parents[2]


def test_an_arm_is_a_method_or_a_label_with_overrides():
    assert parse_arm("grpo") == Arm("grpo", ("method.name=grpo",))
    assert parse_arm("alpha0.1=method.name=orsd,rubric.alpha=0.1") == Arm(
        "alpha0.1", ("method.name=orsd", "rubric.alpha=0.1"))
    # commas inside brackets, braces or quotes belong to the value
    assert split_overrides("a.b=[1, 2],c.d={x: 1, y: 2},e.f='p,q'") == ["a.b=[1, 2]", "c.d={x: 1, y: 2}", "e.f='p,q'"]


@pytest.mark.parametrize("text, says", [
    ("../x", "is not a directory name"),
    ("a b=method.name=grpo", "is not a directory name"),
    ("initial", "reserved for the shared initial policy"),
    ("x=method.name=orsd,alpha", "'alpha' is not section.key=value"),
    ("x=rubric.alpha", "'rubric.alpha' is not section.key=value"),
    ("x=train.seed=3", "train.seed is set by orsd-study"),
    ("x=warm_start.epochs=3", "warm_start.epochs is set by orsd-study"),
    ("x=model.path=/other", "model.path is set by orsd-study"),
])
def test_bad_arms_are_refused_with_the_argument_named(text, says):
    with pytest.raises(StudyError) as error:
        parse_arm(text)
    message = str(error.value)
    assert message.startswith(f"--arms {text!r}:") and says in message and "\n" not in message


def test_repeated_labels_seeds_and_bad_sets_are_refused():
    with pytest.raises(StudyError, match="the label\\(s\\) orsd appear more than once"):
        parse_arms(["orsd", "orsd=method.name=orsd,rubric.alpha=0.1"])
    assert parse_seeds(["0", "2", "1"]) == [0, 2, 1]
    with pytest.raises(StudyError, match="--seeds 'x': expected non-negative integers"):
        parse_seeds(["0", "x"])
    with pytest.raises(StudyError, match="a seed is repeated"):
        parse_seeds(["1", "1"])
    with pytest.raises(StudyError, match="--set 'steps=3': expected section.key=value"):
        parse_overrides(["steps=3"])
    with pytest.raises(StudyError, match="train.seed is set by orsd-study"):
        parse_overrides(["train.seed=4"])


def plan(tmp_path, sets=(), arms=("grpo", "orsd"), seeds=(0, 1), jobs=2, cores=4):
    return make_plan(None, parse_arms(list(arms)), list(seeds), tmp_path / "study", list(sets), jobs, ["python"], cores)


def test_the_plan_shares_one_warm_started_policy(tmp_path):
    p = plan(tmp_path, arms=("grpo", "orsd", "oracle=method.name=static_rubric,"
                             f"method.rubric_file={ROOT / 'configs/rubrics/webshop_static.yaml'}"))
    assert p.base["warm_start"]["enabled"]  # the embedded default warm-starts
    # the initial run is the warm start of the first arm that writes bundles: its demonstrations are in it
    assert p.initial.method == "orsd" and "method.name=orsd" in p.initial.overrides
    assert "train.steps=0" in p.initial.overrides and "model.threads=4" in p.initial.overrides
    policy = p.initial.policy
    assert policy == tmp_path / "study" / "initial" / "checkpoints" / "reference"
    # seed by seed: a grid stopped part-way holds whole seeds
    assert [run.name for run in p.runs] == ["grpo/seed0", "orsd/seed0", "oracle/seed0",
                                            "grpo/seed1", "orsd/seed1", "oracle/seed1"]
    for run in p.runs:
        assert run.path == tmp_path / "study" / run.arm.label / f"seed{run.seed}"
        assert f"model.path={policy}" in run.overrides and "warm_start.enabled=false" in run.overrides
        assert f"train.seed={run.seed}" in run.overrides and "model.threads=2" in run.overrides  # 4 cores / 2 jobs
        assert run.steps == 2  # the embedded default's train.steps


def test_without_a_warm_start_every_arm_keeps_model_path(tmp_path):
    p = plan(tmp_path, sets=["warm_start.enabled=false"], jobs=1, cores=3)
    assert p.initial is None
    assert all(not any(o.startswith("model.path=") for o in run.overrides) for run in p.runs)
    assert all("model.threads=3" in run.overrides for run in p.runs)


def test_a_bad_key_fails_at_planning_naming_the_arm(tmp_path):
    with pytest.raises(StudyError, match="--arms wide: .*rubric.num_bundlez"):
        plan(tmp_path, arms=("grpo", "wide=rubric.num_bundlez=4"))
    with pytest.raises(StudyError, match="--config/--set: .*train.steps=-1"):
        plan(tmp_path, sets=["train.steps=-1"])
    with pytest.raises(StudyError, match="--jobs 0"):
        plan(tmp_path, jobs=0)


def fake_run(path: Path, steps: int, evals=(), checkpoint: bool = False, threads: int = 2):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"model": {"threads": threads}}))
    (path / "steps.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.0}) + "\n"
                                              for s in range(1, steps + 1)))
    (path / "eval.jsonl").write_text("".join(json.dumps({"step": s, "success_rate": 0.0}) + "\n" for s in evals))
    if checkpoint:
        (path / "checkpoints" / f"step_{steps}").mkdir(parents=True)
        (path / "checkpoints" / f"step_{steps}" / "trainer_state.pt").write_bytes(b"")


def test_run_states_from_the_directory(tmp_path):
    p = plan(tmp_path, sets=["train.steps=4", "train.eval_every=2"])
    grpo0, grpo1, orsd0, orsd1 = p.runs
    assert state(grpo0) == "new"
    fake_run(grpo1.path, 4, evals=(0, 2, 4))
    assert state(grpo1) == "finished"
    fake_run(orsd0.path, 4, evals=(0, 2), checkpoint=True, threads=1)  # killed in the last evaluation
    assert state(orsd0) == "resume"
    fake_run(orsd1.path, 1, evals=(0,))  # killed before its first checkpoint
    assert state(orsd1) == "restart"
    # a resumed run keeps its own thread count (orsd-train refuses another) and passes --resume
    overrides = run_overrides(p, orsd0, resume=True)
    assert overrides[-1] == "model.threads=1" and "model.threads=2" not in overrides
    command = train_command(["python"], None, overrides, orsd0.path, resume=True)
    assert command[:3] == ["python", "-m", "orsd.train.cli"] and command[-3:] == ["--run-dir", str(orsd0.path),
                                                                                  "--resume"]


def test_runs_take_the_precision_the_initial_run_chose(tmp_path):
    p = plan(tmp_path, sets=["model.autocast=auto"])
    assert pinned_precision(p) == []  # no initial run yet
    p.initial.path.mkdir(parents=True)
    (p.initial.path / "environment.json").write_text(json.dumps({"precision": {"autocast": ""}}))
    assert pinned_precision(p) == ["model.autocast="]
    assert run_overrides(p, p.runs[0], resume=False)[-1] == "model.autocast="


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["--arms", "grpo", "x=nokey", "--seeds", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orsd-study: --arms 'x=nokey':") and err.count("\n") == 1
    assert cli.main(["--arms", "grpo", "--out", str(tmp_path)]) == 2
    assert "--seeds: required" in capsys.readouterr().err
    assert cli.main(["--out", str(tmp_path / "none"), "--report-only"]) == 2
    assert "study.json does not exist" in capsys.readouterr().err
    assert cli.main(["--arms", "grpo", "--seeds", "0", "--out", str(tmp_path), "--config", "nope.yaml"]) == 2
    assert "--config 'nope.yaml': no such file" in capsys.readouterr().err


def test_dry_run_prints_states_and_commands_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    fake_run(out / "grpo" / "seed0", 2)
    assert cli.main(["--arms", "grpo", "orsd", "--seeds", "0", "--out", str(out), "--dry-run",
                     "--set", "warm_start.enabled=false"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "# grpo/seed0: finished" in printed and "# orsd/seed0: new" in printed
    commands = [line for line in printed if not line.startswith("#")]
    assert len(commands) == 1 and "method.name=orsd" in commands[0] and "train.seed=0" in commands[0]
    assert not (out / "study.json").exists() and not (out / "orsd").exists()


#: the registration arguments of an invocation that gives none (the defaults)
ARGS = cli.parse_args(["--out", "x"])


def test_a_changed_warm_start_is_refused_once_the_initial_policy_exists(tmp_path):
    from orsd.train.config import load_config, to_dict

    p = plan(tmp_path)
    p.initial.policy.mkdir(parents=True)
    (p.initial.policy / "config.json").write_text("{}")
    (p.initial.path / "summary.jsonl").write_text("{}\n")
    (p.initial.path / "config.yaml").write_text(yaml.safe_dump(to_dict(load_config(None, p.initial.overrides))))
    assert cli.study_record(p, None, ARGS)["initial"]["policy"] == str(p.initial.policy)
    # more steps or another evaluation leave the warm start as it was
    assert cli.study_record(plan(tmp_path, sets=["train.steps=40", "train.eval_tasks=8"]), None, ARGS)["initial"]
    with pytest.raises(StudyError, match=r"made with other values of warm_start\.epochs, and every run"):
        cli.study_record(plan(tmp_path, sets=["warm_start.epochs=3"]), None, ARGS)
