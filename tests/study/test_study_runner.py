"""orsd-study's runner with a stand-in for orsd-train (given as --launcher): parallel jobs with the
cores split, a failing run reported with its log while the grid goes on, exit status 1, and the
finished runs skipped on the next invocation."""

import json
import sys

from orsd.study import cli
from orsd.study.grid import cpu_cores

#: stands in for `python -m orsd.train.cli ... --run-dir DIR`: records one step per train.steps and its
#: OMP_NUM_THREADS; an arm with rubric.alpha=0.5 fails the way a crashed run does
FAKE_TRAIN = '''
import json, os, sys, yaml
args = sys.argv[1:]
run_dir = args[args.index("--run-dir") + 1]
overrides = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
os.makedirs(run_dir, exist_ok=True)
if overrides.get("rubric.alpha") == "0.5":
    print("Traceback (most recent call last):\\nRuntimeError: boom in the update")
    sys.exit(3)
with open(os.path.join(run_dir, "config.yaml"), "w") as f:
    yaml.safe_dump({"method": {"name": overrides["method.name"]}, "env": {"name": "webshop"},
                    "model": {"threads": int(overrides["model.threads"])}}, f)
with open(os.path.join(run_dir, "steps.jsonl"), "a") as f:
    for step in range(1, int(overrides["train.steps"]) + 1):
        f.write(json.dumps({"step": step, "reward_mean": 0.1 * step}) + "\\n")
with open(os.path.join(run_dir, "omp.txt"), "w") as f:
    f.write(os.environ.get("OMP_NUM_THREADS", ""))
'''


def study(tmp_path, out, capsys):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAIN)
    code = cli.main(["--arms", "grpo", "bad=method.name=grpo,rubric.alpha=0.5", "--seeds", "0", "1", "--out", str(out),
                     "--jobs", "2", "--no-progress", "--launcher", f"{sys.executable} {fake}",
                     "--set", "warm_start.enabled=false", "train.steps=3"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_failures_are_reported_the_grid_goes_on_and_finished_runs_are_skipped(tmp_path, capsys):
    out = tmp_path / "study"
    code, stdout, stderr = study(tmp_path, out, capsys)
    assert code == 1, stderr
    assert "bad/seed0 FAILED (exit status 3)" in stderr and "RuntimeError: boom in the update" in stderr
    assert "2 run(s) failed: bad/seed0, bad/seed1" in stderr and "grpo/seed1 done (3 steps)" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"] == {"grpo/seed0": "done", "grpo/seed1": "done", "bad/seed0": "failed (exit status 3)",
                               "bad/seed1": "failed (exit status 3)"}
    assert summary["arms"]["grpo"]["steps_recorded"] == {"0": 3, "1": 3}
    threads = str(max(1, cpu_cores() // 2))
    for seed in (0, 1):
        run = out / "grpo" / f"seed{seed}"
        assert (run / "omp.txt").read_text() == threads  # the cores split between 2 jobs
        assert f"model.threads={threads}" in (run / "train.log").read_text().splitlines()[0]
    assert (out / "study.md").is_file() and (out / "curves.png").is_file()

    code, stdout, stderr = study(tmp_path, out, capsys)
    assert code == 1
    assert "2 of 4 runs already finished (skipped)" in stdout
    assert (out / "grpo" / "seed0" / "steps.jsonl").read_text().count("\n") == 3  # not run a second time
    assert (out / "bad" / "seed0" / "train.log").read_text().count("== orsd-study") == 2  # retried
