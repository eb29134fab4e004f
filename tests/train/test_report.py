"""Reporting of a run directory: TensorBoard scalars, curves.png, report.html, `orsd-report`.

The run directories are written here by hand (with the trainer's own RunDir appender and config
writer), with the record shapes of step_records.step_metrics(), records.group_record() and eval.jsonl."""

import html
import json
import re
import sys
import types

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from orsd.train.config import load_config, to_dict
from orsd.report.cli import main, write_report
from orsd.report.curves import curve_data, ema, plot_curves
from orsd.report.logger import Reporter, flatten
from orsd.report.records import pick_groups
from orsd.report.html import delta_heatmap
from orsd.report.run_dir import RunDir

RESPONSE = "<think>the red one is cheaper</think><action>click[b0c1]</action>"


def step_record(step: int, rng: np.random.Generator, mode: str) -> dict:
    bundle = mode == "orsd"
    return {
        "step": step, "reward_mean": float(0.2 + 0.05 * step + rng.normal(0, 0.05)),
        "success_rate": float(min(1.0, 0.1 + 0.04 * step)), "score_mean": float(0.3 + 0.03 * step),
        "groups_rewards_differ": 0.5, "groups_with_bundle": 0.5 if bundle else 0.0,
        "rho_selected_mean": (0.6 if step % 3 else None) if bundle else None,
        "delta_mean": 0.001, "delta_abs_mean": 0.02 if bundle else 0.0, "valid_token_fraction": 0.9,
        "loss": float(rng.normal(0, 0.1)) if step != 2 else None, "pg_loss": 0.01, "kl": 0.001 * step,
        "clip_fraction": 0.05, "entropy": 1.2, "grad_norm": 0.8, "replay_rollout_gap": 0.0003,
        "verifier": {"calls": 16, "retries": 1, "cache_hits": 0} if bundle else {},
        "seconds": {"rollout": 3.5, "bundles": 2.0 if bundle else None, "verify": 1.5, "replay": 0.7, "update": 1.1},
    }


def group_record(step: int, number: int, selected: int | None) -> dict:
    tokens = ["<think>", "the", " red", "</think>", "<action>", "click", "[b0c1]", "</action>"]
    delta_example = None if selected is None else {"trajectory": 0, "turns": [
        {"tokens": tokens, "delta": [0.2, -0.4, 0.1, None, 0.0, 0.4, -0.2, 0.05],
         "valid": [True, True, True, True, False, True, True, True]},
        {"tokens": ["<action>", "buy"], "delta": [0.1, -0.1], "valid": [True, True]}]}
    return {
        "step": step, "group": number,
        "task": {"id": f"shop-{step}-{number}", "split": "train", "kind": "shoes",
                 "description": "Find <b>red</b> shoes under $40 & buy them"},
        "rewards": [1.0, 0.0, 0.5, 0.0], "advantages": [1.2, -0.8, 0.4, -0.8],
        "transcripts": [{"observations": ["WebShop [Search]", "results: b0c1 red shoe $30"],
                         "actions": ["search[red shoes]"], "responses": [RESPONSE], "won": i == 0,
                         "score": [1.0, 0.0, 0.5, 0.0][i], "error": ""} for i in range(4)],
        "bundle_texts": ["1. Searches <query> with the colour\n2. Checks the price", "garbage"],
        "bundle_errors": ["generation 1: no numbered criteria"],
        "bundles": [["Searches <query> with the colour", "Checks the price"], ["Clicks a product", "Buys"]],
        "scores": [[[1.0, 0.5], [0.0, None], [1.0, 1.0], [0.0, 0.0]], [[0.5, 0.5]] * 4],
        "rho": [0.8, None], "satisfaction": [[0.75, 0.0, 1.0, 0.0], [0.5] * 4],
        "selected": selected, "reason": "argmax rho" if selected is not None else "no finite rho",
        "verifier_events": [{"kind": "retry", "status": 429}], "delta_example": delta_example,
    }


def make_run(path, mode="orsd", env="webshop", steps=8, seed=0, evals=True, groups=True):
    run = RunDir(path)
    run.write_config(to_dict(load_config(None, [f"method.name={mode}", f"env.name={env}", f"train.seed={seed}"])))
    (run.path / "environment.json").write_text(json.dumps({"python": "3.11.2", "packages": {"torch": "2.13.0"},
                                                           "seed": seed, "git_sha": "abc123"}))
    rng = np.random.default_rng(seed)
    for step in range(1, steps + 1):
        run.append("steps.jsonl", step_record(step, rng, mode))
        if groups:
            for number in range(2):
                run.append("groups.jsonl", group_record(step, number, 0 if mode == "orsd" and number == 1 else None))
        if evals and step % 4 == 0:
            run.append("eval.jsonl", {"step": step, "split": "test", "env": env, "num_episodes": 16,
                                      "success_rate": 0.25, "score_mean": 0.4,
                                      "per_kind": {"shoes": {"success_rate": 0.5, "episodes": 8},
                                                   "shirts": {"success_rate": 0.0, "episodes": 8}}})
    return run.path


def scalars(log_dir) -> EventAccumulator:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return events


def test_flatten_nested_and_skips_non_numbers():
    flat = flatten({"a": 1, "b": {"c": 2.5, "d": None, "e": "x"}, "f": [1], "g": float("nan"), "h": True,
                    "i": np.float32(0.5)})
    assert flat == {"a": 1.0, "b/c": 2.5, "h": 1.0, "i": 0.5}


def test_reporter_writes_tensorboard_scalars(tmp_path):
    rng = np.random.default_rng(0)
    records = [step_record(step, rng, "orsd") for step in range(1, 4)]
    with Reporter(tmp_path, config=load_config(None, [])) as reporter:
        for record in records:
            reporter.log_step(record)
        reporter.log_eval({"step": 3, "split": "test", "env": "webshop", "num_episodes": 4, "success_rate": 0.5,
                           "score_mean": 0.6, "per_kind": {"shoes": {"success_rate": 0.25, "episodes": 4}}})
    events = scalars(tmp_path / "tensorboard")
    tags = set(events.Tags()["scalars"])
    assert {"reward_mean", "verifier/calls", "seconds/rollout", "eval/test/success_rate",
            "eval/test/per_kind/shoes/success_rate"} <= tags
    assert "step" not in tags and "eval/test/env" not in tags
    rewards = events.Scalars("reward_mean")
    assert [e.step for e in rewards] == [1, 2, 3]
    assert [e.value for e in rewards] == pytest.approx([r["reward_mean"] for r in records])
    # nulls are skipped, not written as 0: step 2 has no loss, steps 3 has no rho (step % 3 == 0)
    assert [e.step for e in events.Scalars("loss")] == [1, 3]
    assert [e.step for e in events.Scalars("rho_selected_mean")] == [1, 2]
    assert events.Scalars("eval/test/per_kind/shoes/success_rate")[0].value == pytest.approx(0.25)
    assert "config/text_summary" in events.Tags()["tensors"]  # the resolved config as text


def test_reporter_purge_step_replaces_steps_after_a_resume(tmp_path):
    with Reporter(tmp_path) as reporter:
        for step in range(1, 5):
            reporter.log_step({"step": step, "reward_mean": float(step)})
    with Reporter(tmp_path, purge_step=3) as reporter:  # resumed from the checkpoint after step 2
        for step in range(3, 6):
            reporter.log_step({"step": step, "reward_mean": 10.0 * step})
    events = scalars(tmp_path / "tensorboard").Scalars("reward_mean")
    assert [(e.step, e.value) for e in events] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]


def test_reporter_rejects_a_record_without_step(tmp_path):
    reporter = Reporter(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match=r"metrics\['step'\]"):
        reporter.log_step({"reward_mean": 1.0})
    with pytest.raises(TypeError, match="config"):
        Reporter(tmp_path, tensorboard=False, config="model.path=x")
    assert not (tmp_path / "tensorboard").exists()


def test_reporter_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ImportError, match="pip install wandb"):
        Reporter(tmp_path, wandb=True)


def test_reporter_wandb_receives_flat_scalars(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    reporter = Reporter(tmp_path, tensorboard=False, wandb=True, config={"rubric": {"mode": "orsd"}})
    reporter.log_step({"step": 7, "reward_mean": 0.5, "seconds": {"rollout": 2.0}, "rho_selected_mean": None})
    reporter.close()
    assert calls[0] == ("init", {"project": "orsd", "name": tmp_path.name, "dir": str(tmp_path),
                                 "config": {"rubric": {"mode": "orsd"}}})
    assert calls[1] == ("log", {"reward_mean": 0.5, "seconds/rollout": 2.0}, 7)
    assert calls[2] == ("finish",)


def test_ema_is_debiased_and_skips_missing():
    out = ema([1.0, None, 3.0, float("nan")], smoothing=0.5)
    # by hand: after 1.0 -> 0.5/(1-0.5) = 1; after 3.0 -> (0.25 + 1.5)/(1-0.25) = 7/3
    assert out[0] == pytest.approx(1.0) and out[2] == pytest.approx(7 / 3)
    assert np.isnan(out[1]) and np.isnan(out[3])
    with pytest.raises(ValueError, match="smoothing"):
        ema([1.0], smoothing=1.0)


def test_curve_data_groups_labels_envs_and_seeds(tmp_path):
    orsd = [make_run(tmp_path / f"orsd{s}", seed=s) for s in range(2)]
    grpo = make_run(tmp_path / "grpo", mode="grpo")
    alf = make_run(tmp_path / "alf", env="alfworld", steps=3)
    curves, notes = curve_data(orsd + [grpo, alf])
    assert notes == []
    by_key = {(c.env, c.label): c for c in curves}
    assert set(by_key) == {("webshop", "ORSD"), ("webshop", "GRPO"), ("alfworld", "ORSD")}
    two_seeds = by_key[("webshop", "ORSD")]
    assert len(two_seeds.runs) == 2 and two_seeds.low is not None
    first = [json.loads(line)["reward_mean"] for line in (orsd[0] / "steps.jsonl").read_text().splitlines()]
    second = [json.loads(line)["reward_mean"] for line in (orsd[1] / "steps.jsonl").read_text().splitlines()]
    assert two_seeds.raw["reward_mean"] == pytest.approx((np.array(first) + np.array(second)) / 2)
    assert np.all(two_seeds.low["reward_mean"] <= two_seeds.high["reward_mean"])
    assert by_key[("webshop", "GRPO")].low is None
    assert np.isnan(by_key[("webshop", "GRPO")].raw["groups_with_bundle"]).sum() == 0


def test_plot_curves_png_is_deterministic_and_non_trivial(tmp_path):
    runs = {"ORSD": make_run(tmp_path / "orsd"), "GRPO": make_run(tmp_path / "grpo", mode="grpo")}
    first = plot_curves(runs, tmp_path / "a.png")
    second = plot_curves(runs, tmp_path / "b.png")
    assert first.read_bytes() == second.read_bytes()
    image = Image.open(first).convert("RGB")
    assert image.width >= 400 and image.height >= 400
    colours = set(map(tuple, np.asarray(image).reshape(-1, 3).tolist()))
    assert len(colours) > 50  # lines, band-free curves, text: far from a blank canvas
    # both curves' colours are drawn: ORSD red #c0392b and GRPO grey #5d6d7e
    assert (0xC0, 0x39, 0x2B) in colours and (0x5D, 0x6D, 0x7E) in colours


def test_plot_curves_survives_empty_steps_and_nulls(tmp_path):
    empty = tmp_path / "empty"
    RunDir(empty)
    (empty / "steps.jsonl").write_text("")
    curves, notes = curve_data([empty])
    assert curves == [] and "steps.jsonl has no steps yet" in notes[0]
    assert plot_curves([empty], tmp_path / "empty.png").stat().st_size > 1000
    nulls = RunDir(tmp_path / "nulls")
    for step in range(1, 5):
        nulls.append("steps.jsonl", {"step": step, "reward_mean": None if step % 2 else 0.5,
                                     "success_rate": None, "groups_with_bundle": float("nan")})
    curves, _ = curve_data([nulls.path])
    assert np.isnan(curves[0].raw["success_rate"]).all()
    assert plot_curves([nulls.path, empty], tmp_path / "nulls.png").exists()
    with pytest.raises(ValueError, match="not a directory"):
        plot_curves([tmp_path / "missing"], tmp_path / "x.png")
    with pytest.raises(TypeError, match="runs"):
        plot_curves(3, tmp_path / "x.png")


def test_pick_groups_prefers_selected_bundles_and_latest_steps(tmp_path):
    run = make_run(tmp_path / "run", steps=4)
    picked = pick_groups(run / "groups.jsonl", limit=5)
    assert [(g["step"], g["group"]) for g in picked] == [(4, 1), (3, 1), (2, 1), (1, 1), (4, 0)]


def heatmap_spans(page: str) -> list[str]:
    blocks = re.findall(r'<div class="heatmap">(.*?)</div>', page, flags=re.S)
    return [span for block in blocks for span in re.findall(r'<span class="tok[^"]*"[^>]*>.*?</span>', block)]


def test_write_report_sections_escaping_chosen_bundle_and_heatmap(tmp_path):
    run = make_run(tmp_path / "orsd")
    grpo = make_run(tmp_path / "grpo", mode="grpo")
    report = write_report(run, compare=[grpo])
    assert report == run / "report.html" and (run / "curves.png").exists()
    page = report.read_text()
    for anchor in ("summary", "config", "curves", "eval", "steps", "groups"):
        assert f'<section id="{anchor}">' in page
    assert "<script" not in page and "<link" not in page and "http" not in page  # self-contained
    assert "data:image/png;base64," in page and 'href="config.yaml"' in page
    assert "method:\n  name: orsd" in page  # the resolved config, inline
    # transcripts and criteria show their tags as text, never as markup
    assert "<think>" not in page and "<action>" not in page and "<b>red</b>" not in page
    assert html.escape(RESPONSE) in page and "&lt;b&gt;red&lt;/b&gt;" in page
    assert html.escape("Searches <query> with the colour") in page
    # 5 groups shown, all with a bundle (8 steps have one each): each marks exactly one chosen bundle
    assert page.count('<div class="group"') == 5
    assert page.count('<tr class="bundle chosen">') == 5 and page.count("chosen (B*)") == 5
    spans = heatmap_spans(page)
    assert len(spans) == 5 * (8 + 2)  # one span per token of each shown Δ example
    assert sum('class="tok invalid"' in s for s in spans) == 5 * 2  # one null Δ, one e = 0 per example
    assert 'title="Δ = -0.4"' in page
    # eval table: per-kind columns and the compared run listed
    assert "<th>shirts</th>" in page and "<th>shoes</th>" in page
    assert str(grpo.resolve()) in page and "GRPO" in page


def test_heatmap_colours_follow_the_sign_and_the_max(tmp_path):
    page = delta_heatmap({"trajectory": 0, "turns": [{"tokens": ["a", "b", "c", "d"], "delta": [0.4, -0.2, 1.0, 0.3],
                                                      "valid": [True, True, False, True]}]})
    spans = heatmap_spans(page)
    # the scale is the max |Δ| over valid tokens (0.4), not the invalid token's 1.0
    assert 'rgba(31,119,180,1.000)' in spans[0] and 'rgba(214,39,40,0.500)' in spans[1]
    assert 'class="tok invalid"' in spans[2] and "+1" in spans[2]
    assert 'rgba(31,119,180,0.750)' in spans[3]


def test_write_report_without_eval_or_bundles(tmp_path):
    run = make_run(tmp_path / "grpo", mode="grpo", evals=False)
    page = write_report(run).read_text()
    assert "no evaluation recorded" in page and "no group had a selected bundle" in page
    assert "chosen (B*)" not in page and '<div class="heatmap">' not in page
    bare = RunDir(tmp_path / "bare").path  # no steps, no groups, no config yet
    page = write_report(bare).read_text()
    assert "steps.jsonl has no steps yet" in page and "groups.jsonl has no groups yet" in page


def test_main_writes_curves_and_report(tmp_path, capsys):
    run = make_run(tmp_path / "orsd", steps=4)
    grpo = make_run(tmp_path / "grpo", mode="grpo", steps=4)
    out = tmp_path / "elsewhere" / "r.html"
    assert main([str(run), "--compare", f"baseline={grpo}", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(run / "curves.png"), str(out)]
    page = out.read_text()
    assert "baseline" in page and 'href="../orsd/config.yaml"' in page
    assert main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
