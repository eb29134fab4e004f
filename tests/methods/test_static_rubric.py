"""static_rubric: a user-written rubric file, validated at load, spliced exactly as B* is."""

import json
from pathlib import Path

import pytest
import torch

from helpers.logprobs import lp_of_response
from orsd import rubric
from orsd.methods import make_method
from orsd.methods.static_rubric import RubricFileError, load_rubric_file
from orsd.rubric import RubricBundle
from orsd.train.bundles import rubric_ids
from orsd.train.build import make_env
from orsd.train.config import load_config
from orsd.train.model import frozen_copy
from orsd.train.trainer import Trainer
from scripted import ScriptedEngine, small_config

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "configs" / "rubrics" / "webshop_static.yaml"


def test_a_list_is_one_rubric_for_every_task(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("- Searches first.\n- '  Buys the matching item.  '\n")
    bundle = load_rubric_file(path)
    assert bundle.criteria == ["Searches first.", "Buys the matching item."]
    assert bundle.source == "manual"


def test_a_json_mapping_is_one_rubric_per_task(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"task-a": ["Opens the fridge."], "task-b": ["Searches.", "Buys."]}))
    rubrics = load_rubric_file(path)
    assert {task: b.criteria for task, b in rubrics.items()} == {"task-a": ["Opens the fridge."],
                                                                  "task-b": ["Searches.", "Buys."]}


@pytest.mark.parametrize("text,expected", [
    ("", "expected a non-empty list of criteria, or a mapping"),
    ("[]", "expected a non-empty list of criteria, got []"),
    ("just a sentence", "expected a non-empty list of criteria, or a mapping"),
    ("- ok\n- 3\n", "criterion 2 is 3: expected a non-empty string"),
    ("- ok\n- ''\n", "criterion 2 is '': expected a non-empty string"),
    ("task-a: []\n", "task 'task-a': expected a non-empty list of criteria"),
    ("task-a: a string\n", "task 'task-a': expected a non-empty list of criteria"),
    ("[unclosed\n", "not valid YAML/JSON"),
])
def test_a_malformed_file_is_an_error_naming_it(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RubricFileError, match="bad.yaml") as error:
        load_rubric_file(path)
    assert expected in str(error.value)


def test_the_method_checks_the_file_when_built(tmp_path):
    with pytest.raises(RubricFileError, match="needs method.rubric_file"):
        make_method(load_config(None, ["method.name=static_rubric"]))
    with pytest.raises(RubricFileError, match="missing.yaml.*no such file"):
        load_rubric_file(tmp_path / "missing.yaml")


def test_the_gpu_smoke_preset_uses_the_shipped_rubric(monkeypatch):
    monkeypatch.chdir(ROOT)  # the preset names its rubric file relative to the repository root
    method = make_method(load_config(ROOT / "configs" / "gpu_smoke_qwen3_1p7b.yaml"))
    assert method.name == "static_rubric" and not method.calls_verifier
    assert method.alpha == 0.01 and len(method.rubrics) == 6


def test_step_splices_the_file_rubric_and_says_why_a_task_has_none(tiny_model, tiny_tokenizer, tmp_path):
    """Task 0 has a rubric in the file, task 1 has none: Δ and A = A_GRPO + α·e·Δ (Eq. 8–9) are
    checked on task 0 against plain forwards of the two contexts; task 1's tokens have e = 0."""
    config = small_config("method.name=static_rubric", f"method.rubric_file={SHIPPED}", "rollout.group_size=2",
                          "rubric.alpha=0.5")
    engine = ScriptedEngine(tiny_model, tiny_tokenizer)
    trainer = Trainer(config, tiny_model, tiny_tokenizer, frozen_copy(tiny_model), None, make_env(config),
                      engine=engine)
    state = trainer.task_rng.getstate()
    first, second = trainer.sample_tasks()
    trainer.task_rng.setstate(state)
    path = tmp_path / "per_task.yaml"
    path.write_text(f"{first.id}:\n  - The agent searches for the product first.\n  - The agent buys it.\n")
    trainer.method = make_method(small_config("method.name=static_rubric", f"method.rubric_file={path}",
                                              "rollout.group_size=2", "rubric.alpha=0.5"))
    initial = frozen_copy(tiny_model)  # replay runs under the rollout weights, before the update
    result = trainer.step()

    assert all("process rubric" not in tiny_tokenizer.decode(p).lower() for prompts, _ in engine.calls
               for p in prompts)  # the policy wrote no bundle
    assert [g.task.id for g in result.groups] == [first.id, second.id]
    kept, missing = result.records
    assert kept["bundles"] == [["The agent searches for the product first.", "The agent buys it."]]
    assert kept["selected"] == 0 and kept["delta_example"]["turns"]
    assert missing["selected"] is None and missing["bundles"] == []
    assert missing["reason"] == f"no rubric for task {second.id!r} in {path}: e = 0"

    record = result.groups[0].trajectories[0].records[0]
    bundle = RubricBundle(["The agent searches for the product first.", "The agent buys it."])
    spliced = rubric_ids(tiny_tokenizer, rubric.rubric_context(bundle), "system")
    with_rubric = record.context_ids[:record.rubric_slot] + spliced + record.context_ids[record.rubric_slot:]
    delta = (lp_of_response(initial, with_rubric, record.response_ids, 1.0)
             - lp_of_response(initial, record.context_ids, record.response_ids, 1.0))
    replay, start = result.outputs.replay, len(record.context_ids)  # record 0 is packed first
    span = slice(start, start + len(record.response_ids))
    assert replay.valid[span].all() and delta.abs().max() > 1e-4
    assert replay.delta[span].double() == pytest.approx(delta, abs=1e-5)
    assert replay.advantages[span].double() == pytest.approx(result.outputs.advantages.episode[0][0] + 0.5 * delta,
                                                             abs=1e-5)
    records_of_task_0 = sum(len(t.records) for t in result.groups[0].trajectories)
    cu = replay.packed.cu_seqlens.tolist()
    later = torch.zeros_like(replay.valid)
    later[cu[records_of_task_0]:] = True
    assert not replay.valid[later].any()  # task 1: no rubric, e = 0 on every token
