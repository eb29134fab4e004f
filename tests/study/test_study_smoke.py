"""orsd-study end to end: grpo and orsd × 2 seeds × 1 step of real orsd-train runs on a tiny random
model, from one warm start; then the same command again, which finds every run finished."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orsd.study.grid import directory_sha256
from orsd.train.config import load_config
from orsd.train.warmstart import draft_corpus
from tiny_model import make_tiny_tokenizer

ROOT = Path(__file__).parents[2]
#: the embedded default (warm start on, bundle demonstrations on) shrunk to seconds: the tiny random model,
#: a 1-episode warm start fitted in place, 1 step of 2 tasks × 2 rollouts, evaluations at steps 0 and 1
SMOKE = ["model.path=random:benchmarks/tiny_random_model.json", "model.ops_self_check='off'",
         "warm_start.episodes=1", "warm_start.epochs=1", "warm_start.bundle_demos=1", "warm_start.process=inline",
         "train.steps=1", "rollout.tasks_per_step=2", "rollout.group_size=2", "env.max_actions=2",
         "rollout.max_new_tokens=16", "rubric.num_bundles=2", "rubric.max_new_tokens=48", "train.eval_before=true",
         "train.eval_every=1", "train.eval_tasks=2", "train.eval_samples=1", "train.tensorboard=false",
         "train.report=false"]


def study(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orsd.study.cli", "--arms", "grpo", "orsd", "--seeds", "0", "1",
                           "--out", str(out), "--jobs", "2", "--no-progress", "--set", *SMOKE],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def responses(path: Path) -> list[tuple[str, list[str]]]:
    """(task id, every trajectory's responses) per group of a run's groups.jsonl."""
    groups = [json.loads(line) for line in (path / "groups.jsonl").read_text().splitlines()]
    return [(g["task"]["id"], [r for t in g["transcripts"] for r in t["responses"]]) for g in groups]


@pytest.mark.slow
def test_study_end_to_end_then_resume_skips(tmp_path):
    out = tmp_path / "study"
    first = study(out)
    assert first.returncode == 0, first.stderr[-3000:]
    record = json.loads((out / "study.json").read_text())
    policy = Path(record["initial"]["policy"])
    assert policy == out / "initial" / "checkpoints" / "reference"
    assert record["initial"]["sha256"] == directory_sha256(policy) and record["initial"]["method"] == "orsd"
    assert record["initial"]["warm_start"]["bundle_demos"] == 1 and record["git_sha"]
    assert not (out / "initial" / "checkpoints" / "step_0").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["arms"]) == ["grpo", "orsd"] and summary["end_step"] == 1
    for label, arm in summary["arms"].items():
        assert arm["method"] == label and arm["seeds"] == [0, 1]
        assert arm["steps_recorded"] == {"0": 1, "1": 1}
        assert arm["heldout"]["start"]["n"] == 2 and arm["heldout"]["end"]["n"] == 2  # over the 2 seeds
        assert arm["heldout"]["episodes"] == 2  # 2 tasks × 1 sample
    # registered before the first run; each run's origin; the start evaluation once per seed, shared
    assert record["registration"]["post_hoc"] is False and record["registration"]["baseline"] == "grpo"
    assert [p["sha256"] for p in record["initial_policies"]] == [record["initial"]["sha256"]]
    assert {name: o["initial_sha256"] for name, o in record["runs"].items()} == \
        {f"{a}/seed{s}": record["initial"]["sha256"] for a in ("grpo", "orsd") for s in (0, 1)}
    for s in (0, 1):
        start = [json.loads(line) for line in (out / "initial" / "eval" / f"seed{s}" / "eval.jsonl").read_text()
                 .splitlines()]
        assert [e["step"] for e in start] == [0] and len(start[0]["episodes"]) == 2
        for a in ("grpo", "orsd"):
            own = [json.loads(line)["step"] for line in (out / a / f"seed{s}" / "eval.jsonl").read_text().splitlines()]
            assert own == [1]  # no step-0 evaluation of its own
            assert summary["arms"][a]["heldout_score"]["per_seed"][str(s)]["start"] == start[0]["score_mean"]
    assert summary["runs"] == {f"{a}/seed{s}": "done" for a in ("grpo", "orsd") for s in (0, 1)}
    for a in ("grpo", "orsd"):
        for s in (0, 1):
            config = yaml.safe_load((out / a / f"seed{s}" / "config.yaml").read_text())
            assert config["model"]["path"] == str(policy) and config["warm_start"]["enabled"] is False
            assert config["train"]["seed"] == s and config["model"]["threads"] >= 1
    # the same policy and seed give both arms the same first rollouts; another seed other tasks
    assert responses(out / "grpo" / "seed0") == responses(out / "orsd" / "seed0")
    assert responses(out / "grpo" / "seed1") == responses(out / "orsd" / "seed1")
    assert responses(out / "grpo" / "seed0") != responses(out / "grpo" / "seed1")
    text = (out / "study.md").read_text()
    assert "| grpo | grpo | 2 |" in text and "| orsd | orsd | 2 |" in text and "## Secondary (exploratory): against grpo" in text
    assert "## Primary endpoint: heldout_score" in text and "registered in study.json on" in text
    logs = {p: p.read_text() for p in out.glob("*/seed*/train.log")}
    assert len(logs) == 4 and all(log.count("== orsd-study") == 1 for log in logs.values())

    again = study(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 of 4 runs already finished (skipped)" in again.stdout + again.stderr
    assert "initial policy" not in again.stdout  # not made again
    assert {p: p.read_text() for p in out.glob("*/seed*/train.log")} == logs  # no run started
    assert all(len(p.read_text().splitlines()) == 1 for p in out.glob("initial/eval/seed*/eval.jsonl"))
    assert directory_sha256(policy) == record["initial"]["sha256"]


def test_a_saved_warm_start_keeps_bundle_drafting(tmp_path):
    """A run started from a warm-started policy (warm start off, warm_start.json beside the policy)
    drafts bundles from the criteria pool as the run that fitted it did."""
    tokenizer = make_tiny_tokenizer()
    policy = tmp_path / "policy"
    policy.mkdir()
    on = load_config(None, ["warm_start.enabled=true", "warm_start.bundle_demos=12", "rubric.draft_tokens=8"])
    off = load_config(None, ["warm_start.enabled=false", "rubric.draft_tokens=8", f"model.path={policy}"])
    assert draft_corpus(off, tokenizer) == []  # no record: nothing says the policy saw the pool
    (policy / "warm_start.json").write_text(json.dumps({"env": "webshop", "bundle_demos": 12,
                                                        "bundle_demos_kind": "content"}))
    assert draft_corpus(off, tokenizer) == draft_corpus(on, tokenizer) != []
    (policy / "warm_start.json").write_text(json.dumps({"env": "alfworld", "bundle_demos": 12}))
    assert draft_corpus(off, tokenizer) == []  # another env's pool


def records(run: Path) -> tuple[list, list, list]:
    """A run's records without timings and verifier accounting (cache hits differ after a resume, by
    design): steps.jsonl, groups.jsonl and eval.jsonl."""
    def read(name):
        return [json.loads(line) for line in (run / name).read_text().splitlines()]

    steps = [{k: v for k, v in s.items() if k not in ("seconds", "verifier")} for s in read("steps.jsonl")]
    groups = [{k: v for k, v in g.items() if k != "verifier_events"} for g in read("groups.jsonl")]
    return steps, groups, [{k: v for k, v in e.items() if k != "seconds"} for e in read("eval.jsonl")]


@pytest.mark.slow
def test_a_study_killed_in_the_middle_of_its_runs_then_run_again_equals_an_unbroken_one(tmp_path):
    """Every run is SIGKILLed in its second step's update, after its step-1 checkpoint (the trainer's
    test hook, inherited through the study's environment): the study reports them failed; the same
    command again resumes them, and their finished records equal those of a study never interrupted."""
    import os

    sets = ["train.steps=2", "train.save_every=1", "train.eval_every=2"]
    argv = ["--arms", "grpo", "orsd", "--seeds", "0", "--jobs", "1", "--no-progress", "--set", *SMOKE, *sets]

    def study_of(out: Path, kill: bool = False) -> subprocess.CompletedProcess:
        env = {**os.environ, **({"ORSD_TEST_KILL_AT": "update:2"} if kill else {})}
        return subprocess.run([sys.executable, "-m", "orsd.study.cli", *argv, "--out", str(out)], capture_output=True,
                              text=True, cwd=ROOT, timeout=900, env=env)

    unbroken = study_of(tmp_path / "unbroken")
    assert unbroken.returncode == 0, unbroken.stderr[-3000:]
    out = tmp_path / "broken"
    first = study_of(out, kill=True)
    assert first.returncode == 1 and "2 run(s) failed: grpo/seed0, orsd/seed0" in first.stderr, first.stderr[-3000:]
    for arm in ("grpo", "orsd"):
        assert [json.loads(line)["step"] for line in (out / arm / "seed0" / "steps.jsonl").read_text().splitlines()] \
            == [1]
    again = study_of(out)
    assert again.returncode == 0, again.stderr[-3000:]
    for arm in ("grpo", "orsd"):
        assert records(out / arm / "seed0") == records(tmp_path / "unbroken" / arm / "seed0"), arm
    assert json.loads((out / "summary.json").read_text())["primary"]["arms"] == \
        json.loads((tmp_path / "unbroken" / "summary.json").read_text())["primary"]["arms"]
