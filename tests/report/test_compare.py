"""`orsd-compare`: the Table 1/2 layout and the reward curves from run directories written by hand
(plain config.yaml mappings, not the config classes: the comparison reads records only)."""

import json
import subprocess
import sys
from pathlib import Path

from PIL import Image

from orsd.report.compare import main, write_comparison
from orsd.report.run_dir import RunDir

ALFWORLD_KINDS = ["pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
                  "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"]


def make_run(path, method, env, evals, model="Qwen/Qwen3-1.7B", steps=6):
    """A run dir with `steps` training steps and the eval records `evals` ({step: record fields})."""
    run = RunDir(path)
    run.write_config({"method": {"name": method}, "env": {"name": env}, "model": {"path": model}})
    for step in range(1, steps + 1):
        run.append("steps.jsonl", {"step": step, "reward_mean": 0.1 * step, "success_rate": 0.05 * step,
                                   "groups_with_bundle": 0.5})
    for step, fields in evals.items():
        run.append("eval.jsonl", {"step": step, "env": env, "split": fields.pop("split", "test"), **fields})
    return path


def alfworld_eval(success, per_kind, split="valid_unseen"):
    return {"split": split, "success_rate": success, "score_mean": success,
            "per_kind": {kind: {"success_rate": value, "episodes": 4} for kind, value in zip(ALFWORLD_KINDS, per_kind)}}


def rows_of(markdown: str) -> dict[str, list[str]]:
    """method label -> its cells after the model, method and n columns."""
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    return {"header": [c.strip() for c in header]} | {r[1].strip(): [c.strip() for c in r[2:]] for r in body}


def test_table_at_the_last_step_all_runs_share(tmp_path):
    """ORSD evaluated at 2, 4, 6 and GRPO at 2, 4: the WebShop columns come from step 4, the last
    shared one, not from ORSD's step 6; the ALFWorld run (its own env) uses its own last step."""
    orsd = make_run(tmp_path / "orsd", "orsd", "webshop", {
        2: {"success_rate": 0.1, "score_mean": 0.2}, 4: {"success_rate": 0.3, "score_mean": 0.55},
        6: {"success_rate": 0.9, "score_mean": 0.9}})
    grpo = make_run(tmp_path / "grpo", "grpo", "webshop", {
        2: {"success_rate": 0.0, "score_mean": 0.1}, 4: {"success_rate": 0.25, "score_mean": 0.5}})
    alf = make_run(tmp_path / "alf", "orsd", "alfworld", {
        3: alfworld_eval(0.5, [1.0, 0.75, 0.5, 0.25, 0.0, 0.5])})
    md, html, png = write_comparison([(None, str(orsd)), (None, str(grpo)), (None, str(alf))], tmp_path / "c.md")
    text = md.read_text()
    assert "WebShop: eval.jsonl at step 4, split test" in text
    assert "ALFWorld: eval.jsonl at step 3, split valid_unseen" in text
    rows = rows_of(text)
    assert rows["header"] == ["model", "method", "n", "ALFWorld Pick", "ALFWorld Look", "ALFWorld Clean",
                              "ALFWorld Heat", "ALFWorld Cool", "ALFWorld Pick2", "ALFWorld All",
                              "WebShop Score", "WebShop Succ."]
    # ORSD's row joins its ALFWorld run and its WebShop run (same model and label)
    assert rows["ORSD"] == ["1 / 1", "100.0", "75.0", "50.0", "25.0", "0.0", "50.0", "50.0", "55.0", "30.0"]
    assert rows["GRPO"] == ["0 / 1"] + ["–"] * 7 + ["50.0", "25.0"]
    page = html.read_text()
    assert '<th colspan="7">ALFWorld</th><th colspan="2">WebShop</th>' in page
    assert "<td>55.0</td><td>30.0</td>" in page and "data:image/png;base64," in page
    assert Image.open(png).size[0] > 100


def test_seeds_are_averaged_and_labels_can_be_given(tmp_path):
    a = make_run(tmp_path / "a", "gigpo", "webshop", {5: {"success_rate": 0.2, "score_mean": 0.4}})
    b = make_run(tmp_path / "b", "gigpo", "webshop", {5: {"success_rate": 0.4, "score_mean": 0.6}})
    c = make_run(tmp_path / "c", "gigpo", "webshop", {5: {"success_rate": 0.0, "score_mean": 0.0}})
    md, _, _ = write_comparison([(None, str(a)), (None, str(b)), ("GiGPO w=2", str(c))], tmp_path / "c.md")
    rows = rows_of(md.read_text())
    assert rows["gigpo"] == ["2", "50.0", "30.0"]  # (40 + 60) / 2, (20 + 40) / 2
    assert rows["GiGPO w=2"] == ["1", "0.0", "0.0"]


def test_no_shared_step_is_said_and_leaves_the_columns_empty(tmp_path):
    a = make_run(tmp_path / "a", "orsd", "webshop", {2: {"success_rate": 0.5, "score_mean": 0.5}})
    b = make_run(tmp_path / "b", "grpo", "webshop", {3: {"success_rate": 0.5, "score_mean": 0.5}})
    c = make_run(tmp_path / "c", "gigpo", "webshop", {})
    md, html, _ = write_comparison([(None, str(a)), (None, str(b)), (None, str(c))], tmp_path / "c.md")
    text = md.read_text()
    assert "WebShop: no evaluation step shared by all 3 runs (last eval step per run: a: 2, b: 3, c: none)" in text
    assert all(cells[1:] == ["–", "–"] for label, cells in rows_of(text).items() if label != "header")
    assert "no eval.jsonl records" in html.read_text()


def test_cli_as_a_module(tmp_path):
    run = make_run(tmp_path / "r", "static_rubric", "webshop", {1: {"success_rate": 0.0, "score_mean": 0.125}})
    out = tmp_path / "out" / "table.md"
    done = subprocess.run([sys.executable, "-m", "orsd.report.compare", f"mine={run}", "--out", str(out)],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(out), str(out.with_suffix(".html")), str(out.with_suffix(".png"))]
    assert rows_of(out.read_text())["mine"] == ["1", "12.5", "0.0"]


def test_cli_errors_name_the_problem(tmp_path, capsys):
    assert main([str(tmp_path / "absent")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    run = make_run(tmp_path / "r", "grpo", "webshop", {})
    assert main([str(run), "--out", str(tmp_path / "x.txt")]) == 2
    assert "expected a path ending in .md" in capsys.readouterr().err


def test_records_only(tmp_path):
    """A run written by a newer orsd with config keys this one does not know still compares."""
    run = make_run(tmp_path / "r", "someday", "webshop", {1: {"success_rate": 1.0, "score_mean": 1.0}})
    config = json.loads(json.dumps({"method": {"name": "someday", "unknown_key": 1}, "env": {"name": "webshop"},
                                    "future_section": {}}))
    RunDir(run).write_config(config)
    md, _, _ = write_comparison([(None, str(run))], tmp_path / "c.md")
    assert rows_of(md.read_text())["someday"] == ["1", "100.0", "100.0"]
