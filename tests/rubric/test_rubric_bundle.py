import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DATA
from orsd.rubric import MAX_CRITERIA, MIN_CRITERIA, RubricBundle, extract_criteria

CASES = [json.loads(line) for line in (DATA / "generations.jsonl").read_text(encoding="utf-8").splitlines()]


def test_corpus_is_substantial():
    assert len(CASES) >= 25
    assert sum(case["expected"] is None for case in CASES) >= 6


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_parse_realistic_generation(case):
    bundle, reason = RubricBundle.parse_with_reason(case["text"], source="policy")
    if case["expected"] is None:
        assert bundle is None
        assert reason.startswith(case["reason"])
        assert RubricBundle.parse(case["text"]) is None
    else:
        assert bundle is not None, reason
        assert bundle.criteria == case["expected"]
        assert MIN_CRITERIA <= len(bundle) <= MAX_CRITERIA
        assert bundle.raw_text == case["text"]
        assert reason.startswith(case["reason"] or "ok")


def test_more_than_eight_keeps_first_eight_and_counts_them():
    text = "\n".join(f"{i}. The agent performs useful step number {i}" for i in range(1, 12))
    bundle, reason = RubricBundle.parse_with_reason(text)
    assert bundle.criteria == [f"The agent performs useful step number {i}" for i in range(1, 9)]
    assert bundle.num_found == 11
    assert reason == "truncated: kept 8 of 11 criteria"


def test_exactly_five_kept_four_discarded():
    items = [f"The agent checks property number {i} carefully" for i in range(1, 6)]
    assert RubricBundle.parse("\n".join(f"- {c}" for c in items)).criteria == items
    bundle, reason = RubricBundle.parse_with_reason("\n".join(f"- {c}" for c in items[:4]))
    assert bundle is None
    assert reason == "too_few_criteria: found 4 valid criteria, need at least 5"


def test_dedupe_ignores_case_and_punctuation():
    text = ("1. The agent opens the fridge first\n2. the agent opens the fridge first.\n"
            "3. THE AGENT OPENS THE FRIDGE FIRST!")
    assert extract_criteria(text) == ["The agent opens the fridge first"]


def test_round_trip_and_numbering():
    bundle = RubricBundle(["Checks the price first", "Reads every option"], source="manual")
    assert bundle.numbered() == "1. Checks the price first\n2. Reads every option"
    assert [c.index for c in bundle.items] == [0, 1]
    again = RubricBundle.from_dict(json.loads(json.dumps(bundle.to_dict())))
    assert again == bundle


@pytest.mark.parametrize("bad", [[], ["ok criterion", ""], "not a list", [3]])
def test_constructor_rejects_bad_criteria(bad):
    with pytest.raises(ValueError, match="criteria"):
        RubricBundle(bad)


def test_parse_rejects_non_string():
    with pytest.raises(TypeError, match="text="):
        RubricBundle.parse(None)


LINE = st.one_of(
    st.text(max_size=60),
    st.builds(lambda marker, words: f"{marker} {' '.join(words)}",
              st.sampled_from(["1.", "2)", "-", "*", "•", "Criterion 3:", "**4.**", "```", "(5)"]),
              st.lists(st.sampled_from(["agent", "checks", "the", "fridge", "first", "opens", "x"]),
                       max_size=9)))


@settings(max_examples=200, deadline=None)
@given(st.lists(LINE, max_size=20))
def test_parse_never_crashes_and_respects_bounds(lines):
    text = "\n".join(lines)
    bundle, reason = RubricBundle.parse_with_reason(text)
    criteria = extract_criteria(text)
    if bundle is None:
        assert len(criteria) < MIN_CRITERIA and reason.startswith(("too_few", "no_criteria"))
    else:
        assert bundle.criteria == criteria[:MAX_CRITERIA]
        assert len({c.lower() for c in bundle.criteria}) == len(bundle)
        assert all(len(c.split()) >= 3 for c in bundle.criteria)
