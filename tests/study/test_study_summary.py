"""orsd-study's report from run directories written here (config.yaml, steps.jsonl, eval.jsonl):
the summary's numbers against values worked out by hand, and every arm in every table and figure."""

import json
import math

import pytest
import yaml

from orsd.report.run_dir import RunDir
from orsd.study import cli
from orsd.study.figures import study_figure
from orsd.study.outputs import write_outputs
from orsd.study.registration import post_hoc
from orsd.study.summary import read_runs, summarize


def t_bounds(values):
    """The Student-t 95 % interval of the mean, from the t quantile (scipy.stats.t.ppf)."""
    from scipy.stats import t

    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def registered(labels, baseline="grpo"):
    return post_hoc(list(labels), baseline)

#: reward = slope × step over 10 steps, so the learning statistic is slope × (8 − 3) = 5 × slope
SLOPES = {"grpo": [0.0, 0.0, 0.0], "orsd": [0.1, 0.2, 0.3], "alpha0.1": [0.02, 0.04, 0.06]}
#: held-out success at step 0 and step 10 per seed
HELDOUT = {"grpo": ([0.0, 0.25, 0.5], [0.0, 0.25, 0.5]), "orsd": ([0.0, 0.25, 0.5], [0.5, 0.75, 1.0]),
           "alpha0.1": ([0.25, 0.25, 0.25], [0.5, 0.25, 0.5])}


def make_study(out, labels=tuple(SLOPES), seeds=(0, 1, 2), steps=10, shaping_keys=False, slopes=SLOPES,
               heldout=HELDOUT):
    for label in labels:
        for seed in seeds:
            run = RunDir(out / label / f"seed{seed}")
            method = "grpo" if label == "grpo" else "orsd"
            run.write_config({"method": {"name": method}, "env": {"name": "webshop"}, "model": {"path": "initial"},
                              "rubric": {"alpha": 0.1 if label == "alpha0.1" else 0.01}})
            for step in range(1, steps + 1):
                record = {"step": step, "reward_mean": slopes[label][seed] * step, "success_rate": 0.1,
                          "score_mean": 0.2, "valid_token_fraction": 0.5, "delta_abs_mean": 0.4,
                          "advantage_abs_mean": 0.8}
                if shaping_keys:
                    record["shaping_ratio_mean"] = 0.001 * step
                run.append("steps.jsonl", record)
            start, end = heldout[label]
            for step, success in ((0, start[seed]), (steps, end[seed])):
                run.append("eval.jsonl", {"step": step, "env": "webshop", "split": "test", "success_rate": success,
                                          "score_mean": success, "num_episodes": 4, "per_kind": {}})
    study = {"out": str(out), "config": "configs/x.yaml", "sets": [], "arms": list(labels), "seeds": list(seeds),
             "initial": {"policy": "initial", "sha256": "ab" * 32, "method": "orsd"}, "git_sha": "abc"}
    (out / "study.json").write_text(json.dumps(study))
    return study


def test_summary_numbers(tmp_path):
    make_study(tmp_path)
    runs = read_runs(tmp_path, list(SLOPES), [0, 1, 2])
    summary = summarize(runs, list(SLOPES), registered(SLOPES))
    assert summary["end_step"] == 10 and summary["baseline"] == "grpo"
    orsd = summary["arms"]["orsd"]
    learning = orsd["learning"]
    assert list(learning["per_seed"].values()) == pytest.approx([0.5, 1.0, 1.5])
    assert learning["mean"] == pytest.approx(1.0)
    assert learning["se"] == pytest.approx(0.5 / math.sqrt(3))  # sd of [0.5, 1, 1.5] is 0.5
    assert learning["n_se"] == pytest.approx(2 * math.sqrt(3))
    # 3 seeds: a t interval, far wider than the seeds' extremes a percentile bootstrap would reach
    assert (learning["low"], learning["high"]) == pytest.approx(t_bounds([0.5, 1.0, 1.5]))
    assert learning["low"] < 0.0 and learning["method"] == "student-t"
    # held-out: over seeds; end − start is 0.5 on every seed, so its interval has no width
    held = orsd["heldout"]
    assert (held["start"]["low"], held["start"]["high"]) == pytest.approx(t_bounds([0.0, 0.25, 0.5]))
    assert held["start"]["mean"] == pytest.approx(0.25) and held["episodes"] == 4
    assert held["end_minus_start"]["mean"] == pytest.approx(0.5)
    assert (held["end_minus_start"]["low"], held["end_minus_start"]["high"]) == pytest.approx((0.5, 0.5))
    # against GRPO, paired by seed: GRPO's gains are all 0, so the differences are ORSD's own gains
    versus = orsd["vs_baseline"]
    assert versus["learning"]["mean"] == pytest.approx(1.0) and versus["learning"]["n"] == 3
    assert versus["heldout_end"]["mean"] == pytest.approx(0.5)  # [0.5, 0.75, 1] − [0, 0.25, 0.5]
    assert versus["heldout_score_end"]["mean"] == pytest.approx(0.5)  # make_study writes success as the score
    assert "vs_baseline" not in summary["arms"]["grpo"]
    grpo = summary["arms"]["grpo"]["learning"]
    assert grpo["mean"] == 0.0 and grpo["n_se"] is None  # 0 / 0: written as null, not NaN
    # the fallback shaping ratio: α · 0.5 · 0.4 / 0.8
    assert summary["arms"]["alpha0.1"]["shaping"]["shaping_ratio"] == pytest.approx(0.025)
    assert summary["arms"]["orsd"]["shaping"]["shaping_ratio"] == pytest.approx(0.0025)
    assert summary["arms"]["orsd"]["shaping"]["source"].startswith("alpha*")


def test_recorded_shaping_ratios_are_averaged(tmp_path):
    make_study(tmp_path, labels=("orsd",), shaping_keys=True)
    summary = summarize(read_runs(tmp_path, ["orsd"], [0, 1, 2]), ["orsd"], registered(["orsd"], "orsd"))
    assert summary["arms"]["orsd"]["shaping"] == {"source": "steps.jsonl",
                                                  "shaping_ratio_mean": pytest.approx(0.0055)}  # mean of 1..10 / 1000


def test_two_seeds_give_a_t_interval_as_wide_as_two_values_allow(tmp_path):
    """Resampling the episodes pooled over 2 seeds showed only the evaluation's sampling noise; the
    unit that carries run-to-run variance is the seed, and with 2 of them the t interval is wide."""
    make_study(tmp_path, labels=("orsd",), seeds=(0, 1))
    held = summarize(read_runs(tmp_path, ["orsd"], [0, 1]), ["orsd"],
                     registered(["orsd"], "orsd"))["arms"]["orsd"]["heldout"]
    assert held["start"]["n"] == 2 and held["start"]["mean"] == pytest.approx(1 / 8)  # seeds at 0 and 0.25
    assert (held["start"]["low"], held["start"]["high"]) == pytest.approx(t_bounds([0.0, 0.25]))
    assert held["end"]["mean"] == pytest.approx(5 / 8)  # 0.5 and 0.75


def test_outputs_name_every_arm(tmp_path):
    study = make_study(tmp_path)
    written = write_outputs(study, {"orsd/seed2": "failed (exit status 1)"})
    assert {p.name for p in written} == {"summary.json", "study.md", "study.html", "curves.png", "heldout.png"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["arms"]) == list(SLOPES) and summary["baseline"] == "grpo"
    assert summary["runs"]["orsd/seed2"] == "failed (exit status 1)" and summary["runs"]["grpo/seed0"] == "finished"
    text = (tmp_path / "study.md").read_text()
    table1 = [line for line in text.splitlines() if line.startswith("| initial |")]
    assert sorted(line.split(" | ")[1] for line in table1) == sorted(SLOPES)  # orsd-compare: one row per arm
    assert all(line.split(" | ")[2] == "3" for line in table1)  # its seeds averaged
    for label in SLOPES:
        assert text.count(f"| {label} |") >= 4, label  # learning, held-out, shaping, Table 1 (and vs GRPO)
    # against GRPO, paired by seed: learning, held-out success and score at the end, seeds
    low, high = t_bounds([0.5, 1.0, 1.5])
    assert f"| orsd | +1.000 [{low:+.3f}, {high:+.3f}] | +0.500 [+0.500, +0.500] | +0.500 [+0.500, +0.500] | 3 |" \
        in text
    # the primary analysis comes first, post hoc here (this study.json holds no registration)
    assert text.index("## Primary endpoint: heldout_score") < text.index("## Secondary (exploratory)")
    assert "chosen after the runs (post hoc" in text
    page = (tmp_path / "study.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and all(f">{label}<" in page for label in SLOPES)


def test_the_figure_tells_a_dozen_arms_apart(tmp_path):
    labels = ["grpo", "orsd"] + [f"arm{i}" for i in range(10)]
    slopes = {**SLOPES, **{label: [0.01 * i] * 3 for i, label in enumerate(labels[2:])}}
    heldout = {label: HELDOUT["grpo"] for label in labels}
    make_study(tmp_path, labels=labels, steps=1, slopes=slopes, heldout=heldout)
    figure = study_figure(read_runs(tmp_path, labels, [0, 1, 2]), labels)
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend == [f"{label} (3 seeds)" for label in labels]
    styles = {(line.get_color(), line.get_linestyle(), line.get_marker()) for line in figure.legends[0].get_lines()}
    assert len(styles) == len(labels)
    reward = figure.axes[0]
    low, high = reward.get_ylim()
    assert low < 0 and high > 0.09 and high - low < 1  # one step, values 0..0.09: the data's range, not ±5 %
    assert reward.get_xlim() == (0.5, 1.5) and list(reward.get_xticks()) == [1.0]
    # one-step runs: every line has a visible marker at its point
    assert all(line.get_marker() not in (None, "None", "") for line in reward.get_lines())


def test_report_only_reads_study_json(tmp_path, capsys):
    make_study(tmp_path, labels=("grpo", "orsd"))
    assert cli.main(["--out", str(tmp_path), "--report-only", "--baseline", "orsd"]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["baseline"] == "orsd"
    assert "summary.json" in capsys.readouterr().out
    assert cli.main(["--out", str(tmp_path), "--report-only", "--baseline", "nope"]) == 2
    assert "--baseline 'nope': expected one of the arms" in capsys.readouterr().err


def test_heldout_score_is_paired_by_seed_from_three_seeds(tmp_path):
    """score_mean of eval.jsonl (make_study writes the success rate there too): per seed start → end,
    means over seeds, and end − start paired by seed only from 3 seeds."""
    make_study(tmp_path, labels=("orsd",))
    own = registered(["orsd"], "orsd")
    score = summarize(read_runs(tmp_path, ["orsd"], [0, 1, 2]), ["orsd"], own)["arms"]["orsd"]["heldout_score"]
    start, end = HELDOUT["orsd"]
    assert score["per_seed"] == {str(s): {"start": start[s], "end": end[s]} for s in range(3)}
    assert score["start"]["mean"] == pytest.approx(sum(start) / 3)
    assert score["end"]["mean"] == pytest.approx(sum(end) / 3)
    assert score["end_minus_start"]["n"] == 3
    assert score["end_minus_start"]["mean"] == pytest.approx((sum(end) - sum(start)) / 3)
    two = summarize(read_runs(tmp_path, ["orsd"], [0, 1]), ["orsd"], own)["arms"]["orsd"]["heldout_score"]
    assert two["end_minus_start"]["n"] == 2


def test_an_arm_without_runs_is_named_by_its_method(tmp_path):
    study = make_study(tmp_path, labels=("grpo",))
    study["arms"] = ["grpo", "control"]
    study["arm_overrides"] = {"grpo": [], "control": ["method.name=orsd", "rubric.delta_baseline=content_free"]}
    write_outputs(study)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["arms"]["control"]["method"] == "orsd" and summary["arms"]["control"]["seeds"] == []
    assert "| control | orsd | 0 |" in (tmp_path / "study.md").read_text()


def _groups(run: RunDir, step: int, actions: list[list[str]], rewards: list[float], task: str = "t1") -> None:
    for group in (0, 1):
        run.append("groups.jsonl", {"step": step, "group": group, "task": {"id": f"{task}-{group}"},
                                    "rewards": rewards, "transcripts": [{"actions": a} for a in actions]})


def test_identical_steps_count_the_rollouts_shared_with_the_baseline(tmp_path):
    """Per seed, the steps from the first in which the arm sampled exactly the baseline's tasks,
    actions and rewards: here the same for 2 steps, then another action at step 3 (seed 0), and
    another reward at step 1 (seed 1); a step rewritten after a resume counts by its last record."""
    make_study(tmp_path, labels=("grpo", "orsd"), seeds=(0, 1))
    same = [["search[a]", "click[b]"], ["search[c]"]]
    for label in ("grpo", "orsd"):
        for seed in (0, 1):
            run = RunDir(tmp_path / label / f"seed{seed}")
            for step in (1, 2, 3, 4):
                parted = label == "orsd" and (seed == 0 and step >= 3)
                _groups(run, step, [["search[a]", "click[x]"], ["search[c]"]] if parted else same,
                        [0.5 if label == "orsd" and seed == 1 and step == 1 else 0.1, 0.0])
    # orsd seed 0 was killed in step 2 after writing one other record of it, then resumed: the last counts
    first = tmp_path / "orsd" / "seed0" / "groups.jsonl"
    lines = first.read_text().splitlines()
    stale = json.loads(lines[2])
    stale["rewards"] = [9.0, 9.0]
    first.write_text("\n".join([*lines[:2], json.dumps(stale), *lines[2:]]) + "\n")  # stale, then the rerun
    summary = summarize(read_runs(tmp_path, ["grpo", "orsd"], [0, 1]), ["grpo", "orsd"], registered(["grpo", "orsd"]))
    assert summary["arms"]["orsd"]["vs_baseline"]["identical_steps"] == {"0": 2, "1": 0}
    (tmp_path / "orsd" / "seed1" / "groups.jsonl").unlink()  # a run that has sampled nothing yet
    summary = summarize(read_runs(tmp_path, ["grpo", "orsd"], [0, 1]), ["grpo", "orsd"], registered(["grpo", "orsd"]))
    assert summary["arms"]["orsd"]["vs_baseline"]["identical_steps"] == {"0": 2, "1": None}
    write_outputs({**json.loads((tmp_path / "study.json").read_text()), "arms": ["grpo", "orsd"], "seeds": [0, 1]})
    assert "| 0: 2, 1: – |" in (tmp_path / "study.md").read_text()


def test_a_run_in_progress_does_not_hide_the_finished_runs_end(tmp_path):
    """A run that has evaluated only at step 0 so far is left out of the common end step."""
    make_study(tmp_path, labels=("grpo", "orsd"))
    run = RunDir(tmp_path / "orsd" / "seed2")
    (run.path / "eval.jsonl").write_text(json.dumps({"step": 0, "success_rate": 0.5, "score_mean": 0.5,
                                                      "num_episodes": 4}) + "\n")
    summary = summarize(read_runs(tmp_path, ["grpo", "orsd"], [0, 1, 2]), ["grpo", "orsd"], registered(["grpo", "orsd"]))
    assert summary["end_step"] == 10
    held = summary["arms"]["orsd"]["heldout"]
    assert held["per_seed"]["2"] == {"start": 0.5, "end": None}
    assert held["end"]["n"] == 2 and held["end"]["mean"] == pytest.approx((0.5 + 0.75) / 2)


def test_a_run_in_progress_is_left_out_of_the_learning_statistic(tmp_path):
    """train.steps says how many steps a run will record; one that has fewer so far has no gain yet
    (with 6 of 10 steps its last window would be steps 2..6, not 6..10 as the others')."""
    make_study(tmp_path, labels=("grpo", "orsd"))
    for seed in (0, 1, 2):
        path = tmp_path / "orsd" / f"seed{seed}"
        config = yaml.safe_load((path / "config.yaml").read_text())
        (path / "config.yaml").write_text(yaml.safe_dump({**config, "train": {"steps": 10}}))
    steps = tmp_path / "orsd" / "seed2" / "steps.jsonl"
    steps.write_text("".join(steps.read_text().splitlines(keepends=True)[:6]))
    orsd = summarize(read_runs(tmp_path, ["grpo", "orsd"], [0, 1, 2]), ["grpo", "orsd"], registered(["grpo", "orsd"]))["arms"]["orsd"]
    assert orsd["learning"]["per_seed"] == pytest.approx({"0": 0.5, "1": 1.0}) and orsd["learning"]["n"] == 2
    assert orsd["vs_baseline"]["learning"]["n"] == 2
    write_outputs({**json.loads((tmp_path / "study.json").read_text()), "arms": ["grpo", "orsd"]})
    assert "| orsd | orsd | 2 | 0.500, 1.000 |" in (tmp_path / "study.md").read_text()  # the finished seeds


def test_table1_and_the_runs_table_tell_an_unfinished_run(tmp_path):
    """A run at its step-0 evaluation is named unfinished and kept out of Table 1, whose shared
    checkpoint stays at the finished runs' last evaluation (it fell back to step 0 before)."""
    make_study(tmp_path, labels=("grpo", "orsd"))
    for path in (tmp_path / "grpo").glob("seed*"):
        config = yaml.safe_load((path / "config.yaml").read_text())
        (path / "config.yaml").write_text(yaml.safe_dump({**config, "train": {"steps": 10}}))
    run = tmp_path / "grpo" / "seed2"
    (run / "steps.jsonl").write_text("".join((run / "steps.jsonl").read_text().splitlines(keepends=True)[:2]))
    (run / "eval.jsonl").write_text((run / "eval.jsonl").read_text().splitlines(keepends=True)[0])
    write_outputs({**json.loads((tmp_path / "study.json").read_text()), "arms": ["grpo", "orsd"]})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"]["grpo/seed2"] == "unfinished (2 of 10 steps)" and summary["runs"]["grpo/seed1"] == "finished"
    text = (tmp_path / "study.md").read_text()
    assert "| grpo/seed2 | 2 | unfinished (2 of 10 steps) |" in text
    assert "- WebShop: eval.jsonl at step 10, split test, the last step evaluated by all 5 runs" in text
    assert "| initial | grpo | 2 | 12.5 | 12.5 |" in text  # seeds 0 and 1 at step 10: success (and score) 0 and 0.25
