"""orsd-study's pre-registration: the endpoint, baseline, margin and α are fixed in study.json at the
first invocation; a resumed study that changes any of them is refused; arms that appear after the first
run are marked as added later and kept out of the primary family."""

import json

import pytest

from orsd.study import cli
from orsd.study.grid import StudyError
from orsd.study.registration import family, post_hoc, register, role

ARMS = ["grpo", "orsd", "control", "oracle_wide"]


def first(**kw):
    return register(None, ARMS, ["oracle_wide"], "grpo", endpoint=kw.get("endpoint"), margin=kw.get("margin"),
                    alpha=kw.get("alpha"), started=False)


def test_a_first_invocation_registers_defaults_and_roles():
    registration = first()
    assert (registration["endpoint"], registration["baseline"], registration["margin"], registration["alpha"]) == \
        ("heldout_score", "grpo", 0.05, 0.05)
    assert registration["post_hoc"] is False and registration["registered"]
    assert family(registration) == ["orsd", "control"]
    assert [role(registration, a) for a in ARMS] == ["baseline", "primary", "primary", "exploratory"]


@pytest.mark.parametrize("key,value", [("endpoint", "learning"), ("margin", 0.1), ("alpha", 0.01)])
def test_a_resumed_study_may_not_change_what_it_was_registered_with(key, value):
    registration = first()
    again = register(registration, ARMS, [], "grpo", endpoint=None, margin=None, alpha=None, started=True)
    assert {k: again[k] for k in ("endpoint", "margin", "alpha")} == \
        {k: registration[k] for k in ("endpoint", "margin", "alpha")}  # not given: the recorded values
    with pytest.raises(StudyError, match=f"--{key} {value}: this study was registered with {key}"):
        register(registration, ARMS, [], "grpo", **{"endpoint": None, "margin": None, "alpha": None, key: value},
                 started=True)
    with pytest.raises(StudyError, match="--baseline orsd: this study was registered with baseline 'grpo'"):
        register(registration, ARMS, [], "orsd", endpoint=None, margin=None, alpha=None, started=True)


def test_an_arm_added_after_the_first_run_is_outside_the_family():
    registration = register(first(), [*ARMS, "late"], [], "grpo", endpoint=None, margin=None, alpha=None,
                            started=True)
    assert registration["arms"]["late"] == {"role": "primary", "added_later": True}
    assert family(registration) == ["orsd", "control"]
    assert role(registration, "late") == "exploratory (added later)"


@pytest.mark.parametrize("kw,message", [({"margin": 0.0}, "--margin 0.0: expected a positive number"),
                                        ({"alpha": 1.5}, "--alpha 1.5: expected a number between 0 and 1"),
                                        ({"endpoint": "reward"}, "--endpoint 'reward': expected one of")])
def test_values_no_registration_can_hold_are_refused(kw, message):
    with pytest.raises(StudyError, match=message):
        first(**kw)


def test_a_study_recorded_before_registration_is_post_hoc():
    registration = post_hoc(["grpo", "orsd"], "grpo")
    assert registration["post_hoc"] is True and registration["registered"] is None
    assert family(registration) == ["orsd"]


def test_the_cli_refuses_a_changed_margin_on_resume_and_on_report(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "grpo" / "seed0").mkdir(parents=True)
    (out / "grpo" / "seed0" / "config.yaml").write_text("{}\n")  # a run exists
    record = {"out": str(out), "config": None, "sets": [], "arms": ["grpo", "orsd"], "seeds": [0],
              "arm_overrides": {"grpo": ["method.name=grpo"], "orsd": ["method.name=orsd"]},
              "registration": register(None, ["grpo", "orsd"], [], "grpo", endpoint=None, margin=None, alpha=None,
                                       started=False)}
    (out / "study.json").write_text(json.dumps(record))
    argv = ["--arms", "grpo", "orsd", "--seeds", "0", "--out", str(out), "--margin", "0.1", "--dry-run"]
    # (were the refusal missing, these sets keep the run that would start small)
    assert cli.main(argv[:-1] + ["--set", "train.steps=0", "warm_start.enabled=false", "train.eval_before=false",
                                 "model.path=random:benchmarks/tiny_random_model.json"]) == 2
    err = capsys.readouterr().err
    assert "--margin 0.1: this study was registered with margin 0.05 before its first run" in err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(["--out", str(out), "--report-only", "--endpoint", "learning"]) == 2
    assert "--endpoint learning: this study was registered with endpoint 'heldout_score'" in capsys.readouterr().err
    assert json.loads((out / "study.json").read_text()) == record  # nothing was written
