import inspect
import os
import re
from pathlib import Path

import numpy as np
import pytest

from orsd.rubric import (TEMPLATE_DIR, PromptTemplates, RubricBundle, format_transcript,
                         generation_messages, load_template, rubric_context, verification_messages,
                         yes_no_messages)
from orsd.rubric.prompts import PLACEHOLDERS, answer_json_schema, reask_messages

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rubrics.md"
BUNDLE = RubricBundle([f"The agent does observable thing number {i}" for i in range(1, 6)])


def episode(seed: int, steps: int = 3):
    observations = [f"You are in room {seed}. You see a table {seed}."]
    actions = []
    for t in range(1, steps + 1):
        actions.append(None if t == 2 else f"go to table {seed + t}")
        observations.append(f"You arrive at table {seed + t}. On it you see a cup {t}.")
    return observations, actions


def test_format_transcript_layout_and_invalid_action():
    observations, actions = episode(1)
    text = format_transcript(observations, actions)
    assert text.splitlines() == [
        "Observation 0: You are in room 1. You see a table 1.",
        "Action 1: go to table 2",
        "Observation 1: You arrive at table 2. On it you see a cup 1.",
        "Action 2: (invalid action: no well-formed command)",
        "Observation 2: You arrive at table 3. On it you see a cup 2.",
        "Action 3: go to table 4",
        "Observation 3: You arrive at table 4. On it you see a cup 3.",
    ]
    # an episode cut by the horizon has no observation after its last action
    assert format_transcript(observations[:3], actions).endswith("Action 3: go to table 4")


def test_format_transcript_budget_keeps_start_and_end():
    observations, actions = episode(7, steps=60)
    full = format_transcript(observations, actions, max_chars=None)
    cut = format_transcript(observations, actions, max_chars=600)
    assert len(full) > 600 >= len(cut)
    assert cut.startswith("Observation 0: You are in room 7.")
    assert cut.endswith(full[-100:])
    omitted = int(re.search(r"\[\.\.\. (\d+) characters omitted \.\.\.\]", cut).group(1))
    marker = f"\n[... {omitted} characters omitted ...]\n"
    head, tail = cut.split(marker)
    assert full.startswith(head) and full.endswith(tail)
    assert len(head) + len(tail) + omitted == len(full)


@pytest.mark.parametrize("observations, actions, error", [
    (["a", "b", "c"], ["x"], ValueError), ([], [], ValueError), ("obs", [], TypeError),
    (["a", 3], ["x"], TypeError), (["a", "b"], [5], TypeError)])
def test_format_transcript_rejects_bad_input(observations, actions, error):
    with pytest.raises(error):
        format_transcript(observations, actions)


def test_rewards_never_enter_the_generation_prompt():
    # the signatures cannot take them ...
    assert list(inspect.signature(generation_messages).parameters) == ["task", "transcripts", "template"]
    assert list(inspect.signature(format_transcript).parameters) == ["observations", "actions", "max_chars",
                                                                     "keep_actions"]
    # ... and a group whose trajectories have distinct rewards leaves no trace of them
    rewards = np.array([0.0, 1.0, 0.25, 10.0])
    transcripts = [format_transcript(*episode(seed)) for seed in range(len(rewards))]
    messages = generation_messages("Put a cup on a table.", transcripts)
    text = " ".join(m["content"] for m in messages).lower()
    for word in ("reward", "score", "success", "succeed", "won", "fail", "return"):
        assert word not in text
    for seed in range(len(rewards)):
        assert transcripts[seed] in messages[0]["content"]
    assert "Attempt 4:" in messages[0]["content"]


def test_generation_prompt_asks_for_five_to_eight_numbered_criteria():
    content = generation_messages("Buy a shirt.", ["Observation 0: shop"])[0]["content"]
    assert "5 to 8 criteria" in content and "numbered list" in content
    assert "{task}" not in content and "{transcripts}" not in content


def test_verification_prompts_per_trajectory_and_group():
    one = verification_messages("Buy a shirt.", "Observation 0: shop", BUNDLE)[0]["content"]
    assert "rubric of 5 criteria" in one and BUNDLE.numbered() in one
    assert '{"scores": [s1, s2, ..., s5]}' in one
    group = verification_messages("Buy a shirt.", ["t one", "t two"], BUNDLE, mode="per_group")[0]["content"]
    assert "Judge each of 2 attempts" in group and "Attempt 2:\nt two" in group
    with pytest.raises(TypeError):
        verification_messages("Buy a shirt.", ["t"], BUNDLE, mode="per_trajectory")
    with pytest.raises(ValueError, match="mode="):
        verification_messages("Buy a shirt.", "t", BUNDLE, mode="batch")


def test_yes_no_prompt_puts_the_criterion_last():
    a = yes_no_messages("Task.", "Observation 0: x", BUNDLE.criteria[0])[0]["content"]
    b = yes_no_messages("Task.", "Observation 0: x", BUNDLE.criteria[1])[0]["content"]
    common = len(os.path.commonprefix([a, b]))
    assert a[common:] == "1" and b[common:] == "2"


def test_rubric_context_text():
    assert rubric_context(BUNDLE) == ("Process rubric for this task (privileged guidance):\n"
                                      + BUNDLE.numbered())


def test_one_pass_substitution_leaves_values_alone():
    content = generation_messages("Type {transcripts} literally.", ["Action 1: echo {task}"])[0]["content"]
    assert "Type {transcripts} literally." in content and "Action 1: echo {task}" in content


def test_template_overrides(tmp_path):
    path = tmp_path / "gen.txt"
    path.write_text("T={task}\n{transcripts}\n", encoding="utf-8")
    assert generation_messages("x", ["y"], template=path)[0]["content"] == "T=x\nAttempt 1:\ny"
    assert generation_messages("x", ["y"], template=str(path))[0]["content"] == "T=x\nAttempt 1:\ny"
    assert generation_messages("x", ["y"], template="{task}|{transcripts}")[0]["content"] == "x|Attempt 1:\ny"
    with pytest.raises(ValueError, match=r"lacks placeholder\(s\) \{transcripts\}"):
        generation_messages("x", ["y"], template="only {task}")
    templates = PromptTemplates.from_config({"rubric_context": "Guidance:\n{criteria}"})
    assert rubric_context(BUNDLE, templates.rubric_context).startswith("Guidance:\n1. ")
    with pytest.raises(ValueError, match="unknown"):
        PromptTemplates.from_config({"generaton": "x"})


def test_reask_and_schema():
    messages = reask_messages([{"role": "user", "content": "q"}], "oops", "no JSON object found",
                              "per_trajectory", 3)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert '{"scores": [s1, s2, s3]}' in messages[-1]["content"]
    schema = answer_json_schema("per_group", 3, 2)
    assert schema["properties"]["scores"]["minItems"] == 2
    assert schema["properties"]["scores"]["items"]["maxItems"] == 3


def test_docs_name_every_template_and_its_placeholders():
    """docs/rubrics.md points to the template files rather than quoting them: the files are exactly
    the templates orsd loads, and each has a row naming all its placeholders, the required first."""
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = line.split("|")
        if len(cells) > 4 and (named := re.match(r"\s*`(\w+)\.txt`", cells[1])):
            rows[named.group(1)] = cells[3]
    assert sorted(p.stem for p in TEMPLATE_DIR.glob("*.txt")) == sorted(PLACEHOLDERS) == sorted(rows)
    for name, (allowed, required) in PLACEHOLDERS.items():
        listed = re.findall(r"`\{(\w+)\}`", rows[name])
        assert set(listed) == allowed, f"docs/rubrics.md's row for {name}.txt lists {listed}, the file takes {sorted(allowed)}"
        assert set(listed[:len(required)]) == required, f"{name}.txt: the required placeholders {sorted(required)} first"