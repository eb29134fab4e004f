import json
import math

import numpy as np
import pytest

from conftest import DATA
from orsd.rubric import find_json_object, parse_group_answer, parse_score_answer, yes_probability

CASES = [json.loads(line) for line in (DATA / "verifier_answers.jsonl").read_text(encoding="utf-8").splitlines()]


def as_array(expected):
    return np.array([[math.nan if v is None else v for v in row] for row in expected], dtype=float) \
        if expected and isinstance(expected[0], list) else \
        np.array([math.nan if v is None else v for v in expected], dtype=float)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_parse_realistic_answer(case):
    if case["mode"] == "per_trajectory":
        parsed = parse_score_answer(case["text"], case["num_criteria"], trajectory=3)
    else:
        parsed = parse_group_answer(case["text"], case["num_trajectories"], case["num_criteria"])
    np.testing.assert_array_equal(parsed.scores, as_array(case["expected"]))
    assert (parsed.malformed is not None) == case["malformed"]
    assert sorted({p.reason for p in parsed.problems}) == case["reasons"]
    assert parsed.clamped == case["clamped"]
    # every NaN cell is explained by a problem naming its row (and its criterion, or all of them)
    scores = parsed.scores.reshape(-1, case["num_criteria"])
    for row, col in zip(*np.nonzero(np.isnan(scores))):
        trajectory = 3 if case["mode"] == "per_trajectory" else int(row)
        assert any(p.trajectory in (trajectory, None) and p.criterion in (int(col), None)
                   for p in parsed.problems), (row, col, parsed.problems)
    if case["mode"] == "per_trajectory":
        assert all(p.trajectory == 3 for p in parsed.problems)


def test_find_json_object_prefers_scores():
    assert find_json_object('{"a": 1} {"scores": [1]}') == {"scores": [1]}
    assert find_json_object('{"a": 1}') == {"a": 1}
    assert find_json_object("no braces") is None


def test_yes_probability():
    p, why = yes_probability([(" Yes", math.log(0.6)), ("No", math.log(0.2)), ("yes", math.log(0.1)),
                              ("Maybe", math.log(0.1))])
    assert why is None and p == pytest.approx(0.7 / 0.9)
    p, why = yes_probability([("Sure", -0.1), ("I", -3.0)])
    assert math.isnan(p) and why.startswith("no_yes_no_token")
    # the chosen token is usually repeated among the candidates: count it once
    p, _ = yes_probability([("no", math.log(0.5)), ("no", math.log(0.5)), ("yes", math.log(0.25))])
    assert p == pytest.approx(0.25 / 0.75)


def test_bad_counts_rejected():
    with pytest.raises(ValueError, match="num_criteria"):
        parse_score_answer("{}", 0)
