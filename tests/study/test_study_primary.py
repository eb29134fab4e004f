"""The study's primary analysis on run directories written here: the registered endpoint per arm and
seed, each arm against the baseline paired by seed with the library's tests, and the decision they
allow; the per-episode records as rliable's strata; the shared start evaluation read as step 0."""

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests

from orsd.report.run_dir import RunDir
from orsd.study.outputs import write_outputs
from orsd.study.primary import analyse
from orsd.study.registration import register
from orsd.study.summary import read_runs

BASE = [0.40, 0.50, 0.45, 0.55]
#: per arm, its held-out score at the end minus the baseline's, per seed
OFFSETS = {"grpo": [0.0] * 4, "better": [0.20, 0.25, 0.22, 0.18], "same": [0.01, -0.01, 0.005, -0.005],
           "noisy": [0.30, -0.30, 0.20, -0.10], "wide": [0.20, 0.25, 0.22, 0.18]}
TASKS = ["t0", "t1", "t2", "t3"]


def episodes(score: float) -> list[dict]:
    """Two episodes per task whose scores average to `score` (task j's pair off by ±0.01·j)."""
    return [{"task": task, "kind": "k", "sample": s, "score": score + (0.01 * j if s else -0.01 * j), "won": False,
             "actions": [], "invalid_actions": 0} for j, task in enumerate(TASKS) for s in (0, 1)]


def make_runs(out, labels=tuple(OFFSETS), shared_start=False):
    for label in labels:
        for seed, base in enumerate(BASE):
            run = RunDir(out / label / f"seed{seed}")
            run.write_config({"method": {"name": "grpo" if label == "grpo" else "orsd"}, "train": {"steps": 2}})
            for step in (1, 2):
                run.append("steps.jsonl", {"step": step, "reward_mean": 0.1 * step})
            end = base + OFFSETS[label][seed]
            records = [(2, end)] if shared_start else [(0, base - 0.3), (2, end)]
            for step, score in records:
                run.append("eval.jsonl", {"step": step, "success_rate": 0.0, "score_mean": score, "num_episodes": 8,
                                          "episodes": episodes(score)})
    if shared_start:
        for seed, base in enumerate(BASE):
            RunDir(out / "initial" / "eval" / f"seed{seed}").append(
                "eval.jsonl", {"step": 0, "success_rate": 0.0, "score_mean": base - 0.3, "num_episodes": 8})


def registration(labels=tuple(OFFSETS)):
    return register(None, list(labels), [label for label in labels if label == "wide"], "grpo", endpoint=None, margin=0.05, alpha=0.05, started=False)


def test_decisions_follow_holm_and_tost(tmp_path):
    make_runs(tmp_path)
    primary = analyse(read_runs(tmp_path, list(OFFSETS), [0, 1, 2, 3]), list(OFFSETS), registration(), 2, 5)
    assert primary["family"] == ["better", "same", "noisy"] and primary["end_step"] == 2
    assert primary["arms"]["grpo"]["per_seed"] == {str(s): pytest.approx(v) for s, v in enumerate(BASE)}
    assert primary["arms"]["better"]["strata"] == "4 held-out tasks"  # per-episode records: one stratum a task
    comparisons = primary["comparisons"]
    raw = {label: scipy_stats.ttest_1samp(OFFSETS[label], 0.0).pvalue for label in ("better", "same", "noisy")}
    holm = multipletests(list(raw.values()), method="holm")[1]
    for (label, p), adjusted in zip(raw.items(), holm):
        assert comparisons[label]["difference"]["p_value"] == pytest.approx(p, rel=1e-6)
        assert comparisons[label]["p_holm"] == pytest.approx(adjusted, rel=1e-6)
        assert comparisons[label]["difference"]["mean"] == pytest.approx(np.mean(OFFSETS[label]))
    assert comparisons["better"]["decision"] == "better"
    assert comparisons["same"]["decision"].startswith("equivalent") and comparisons["same"]["tost"]["passed"]
    assert comparisons["noisy"]["decision"] == "not decided" and not comparisons["noisy"]["tost"]["passed"]
    # the minimum detectable difference grows with the paired spread
    assert 0 < comparisons["same"]["mdd"] < comparisons["noisy"]["mdd"]
    # exploratory: the same offsets as "better", its own uncorrected test, outside the family
    wide = comparisons["wide"]
    assert wide["role"] == "exploratory" and wide["p_holm"] is None and wide["decision"] == "better"
    assert wide["difference"]["p_value"] == pytest.approx(raw["better"], rel=1e-6)
    # rliable: every seed of "better" beats every seed of grpo on most tasks
    assert comparisons["better"]["probability_of_improvement"]["point"] > 0.8


def test_a_seed_missing_in_the_baseline_is_left_out_of_the_pairing(tmp_path):
    make_runs(tmp_path, labels=("grpo", "better"))
    (tmp_path / "grpo" / "seed3" / "eval.jsonl").unlink()
    primary = analyse(read_runs(tmp_path, ["grpo", "better"], [0, 1, 2, 3]), ["grpo", "better"],
                      registration(("grpo", "better")), 2, 5)
    assert primary["comparisons"]["better"]["n"] == 3
    assert primary["comparisons"]["better"]["difference"]["seeds"] == [0, 1, 2]


def test_the_shared_start_evaluation_is_every_arms_step_0_and_the_report_says_what_it_decided(tmp_path):
    make_runs(tmp_path, labels=("grpo", "better", "same", "noisy", "wide"), shared_start=True)
    study = {"out": str(tmp_path), "config": None, "sets": [], "arms": list(OFFSETS), "seeds": [0, 1, 2, 3],
             "registration": registration()}
    (tmp_path / "study.json").write_text(json.dumps(study))
    write_outputs(study)
    summary = json.loads((tmp_path / "summary.json").read_text())
    score = summary["arms"]["better"]["heldout_score"]
    assert score["per_seed"]["0"] == {"start": pytest.approx(BASE[0] - 0.3), "end": pytest.approx(BASE[0] + 0.2)}
    assert score["end_minus_start"]["n"] == 4
    text = (tmp_path / "study.md").read_text()
    assert "registered in study.json on" in text
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if " | primary | " in line}  # the last table's
    assert rows["noisy"].endswith("| not decided |") and rows["better"].endswith("| better |")
