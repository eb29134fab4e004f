"""`orsd-verifier-check` end to end on a tiny random model, and its one-line errors."""

import json
from pathlib import Path

import pytest

from orsd.probe import verifier_cli
from orsd.probe.truth import KINDS

STUDY = Path(__file__).parents[2] / "configs" / "cpu_study.yaml"


def test_verifier_check_cli_smoke(tiny_smol_dir, tmp_path, capsys, one_torch_thread):
    out = tmp_path / "check"
    argv = [str(tiny_smol_dir), "--config", str(STUDY), "--tasks", "2", "--samples", "1",
            "--variants", "training", "actions_kept", "--out", str(out), "rollout.max_new_tokens=8",
            "model.threads=1", "model.autocast="]
    assert verifier_cli.main(argv) == 0
    result = json.loads((out / "verifier_check.json").read_text())
    assert [t["id"] for t in result["tasks"]] and len(result["tasks"]) == 2
    names = [e["name"] for e in result["episodes"]]
    assert names.count("expert") == names.count("empty") == names.count("policy_0") == 2
    assert set(result["variants"]) == {"training", "actions_kept"}
    for name, variant in result["variants"].items():
        assert variant["transcripts"] == len(names) - 2  # the empty transcripts are not counted
        for figure in [variant["figures"]["auc"], *variant["figures"]["auc_by_kind"].values()]:
            if figure["value"] is not None:
                assert 0 <= figure["value"] <= 1
        stored = json.loads((out / "variants" / f"{name}.json").read_text())
        assert stored["figures"] == variant["figures"]
        assert [len(s) for s in stored["scores"]] == [sum(e["task"] == i for e in result["episodes"]) for i in range(2)]
    assert result["variants"]["actions_kept"]["transcripts_that_lost_an_action"] == 0
    assert result["variants"]["training"]["within_minus_training"]["value"] in (0.0, None)
    assert "within_minus_training" in result["variants"]["actions_kept"]
    table = (out / "verifier_check.md").read_text()
    assert all(f"| {name} |" in table for name in result["variants"]) and all(k in table for k in KINDS)
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize("argv, names", [
    (["does/not/exist"], "CHECKPOINT=does/not/exist: not found"),
    (["smollm2-135m", "--tasks", "1"], "--tasks=1: expected an integer >= 2"),
    (["smollm2-135m", "--samples", "-1"], "--samples=-1: expected an integer >= 0"),
    (["smollm2-135m", "--variants", "training", "nope"], "--variants nope: expected names among training"),
    (["smollm2-135m", "--variants", "wide", "wide"], "--variants wide wide: expected each name once"),
    (["smollm2-135m", "--split", "nope"], "--split=nope: expected one of"),
    (["smollm2-135m", "env.name=alfworld"], "env.name='alfworld'"),
    (["smollm2-135m", "rubric.nonsense=1"], "rubric.nonsense"),
])
def test_bad_arguments_are_one_line_errors(argv, names, capsys):
    assert verifier_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("orsd-verifier-check: ") and names in err and err.count("\n") == 1
