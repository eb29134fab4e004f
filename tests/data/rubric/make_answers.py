"""Writes verifier_answers.jsonl: realistic verifier replies with what a careful reader takes from
each: expected scores (null = NaN), whether the answer is malformed, and the reasons recorded."""
import json
from pathlib import Path

cases = []
def add(name, text, k, expected, malformed=False, reasons=(), clamped=0, mode="per_trajectory", n=1):
    cases.append({"name": name, "text": text, "num_criteria": k, "num_trajectories": n, "mode": mode,
                  "expected": expected, "malformed": malformed, "reasons": sorted(set(reasons)),
                  "clamped": clamped})

add("clean", '{"scores": [1, 0, 0.5, 0.25, 0.75]}', 5, [1, 0, 0.5, 0.25, 0.75])
add("code_fence", '```json\n{"scores": [0.9, 0.1, 1.0, 0.0, 0.6]}\n```', 5, [0.9, 0.1, 1.0, 0.0, 0.6])
add("prose_around", 'Here is my assessment.\n{"scores": [1, 1, 0, 0, 1, 0.5]}\nLet me know if you need more.',
    6, [1, 1, 0, 0, 1, 0.5])
add("reasoning_then_json", 'Criterion 1 is met {mostly}. Criterion 2 is not.\nFinal: {"scores": [0.8, 0.0, 1, 1, 0.3]}',
    5, [0.8, 0.0, 1, 1, 0.3])
add("think_block", '<think>{"scores": [0,0,0,0,0]} hmm, let me reconsider</think>{"scores": [1, 0.5, 0.5, 1, 0]}',
    5, [1, 0.5, 0.5, 1, 0])
add("numeric_strings", '{"scores": ["0.7", "1", " 0 ", "0.25", "0.5"]}', 5, [0.7, 1, 0, 0.25, 0.5])
add("out_of_range_clamped", '{"scores": [1.5, -0.2, 7, 0.5, 0]}', 5, [1, 0, 1, 0.5, 0], clamped=3)
add("missing_scores", '{"scores": [1, 0, 1]}', 5, [1, 0, 1, None, None], reasons=["missing_score"])
add("extra_scores", '{"scores": [1, 0, 1, 0, 1, 0.5, 0.5]}', 5, [1, 0, 1, 0, 1], reasons=["extra_score"])
add("unparsable_entries", '{"scores": [1, "high", null, true, 0.5]}', 5, [1, None, None, None, 0.5],
    reasons=["unparsable_score", "missing_score"])
add("nan_and_infinity", '{"scores": [NaN, Infinity, 0.5, 1, 0]}', 5, [None, None, 0.5, 1, 0],
    reasons=["unparsable_score"])
add("huge_integer", '{"scores": [1' + '0' * 400 + ', 0, 0, 0, 0]}', 5, [None, 0, 0, 0, 0], reasons=["unparsable_score"])
add("dict_keyed_by_number", '{"scores": {"1": 0.5, "2": 1, "3": 0, "4": 0.2, "5": 0.9}}', 5, [0.5, 1, 0, 0.2, 0.9])
add("dict_missing_key", '{"scores": {"1": 0.5, "2": 1, "4": 0.2, "5": 0.9, "9": 1}}', 5, [0.5, 1, None, 0.2, 0.9],
    reasons=["missing_score", "extra_score"])
add("extra_keys_ignored", '{"reasoning": "ok", "scores": [0, 0, 0, 0, 1], "overall": 0.2}', 5, [0, 0, 0, 0, 1])
add("no_json", "The agent did well on most criteria.", 5, [None] * 5, malformed=True, reasons=["malformed_json"])
add("empty", "", 5, [None] * 5, malformed=True, reasons=["malformed_json"])
add("truncated_json", '{"scores": [1, 0, 0.5', 5, [None] * 5, malformed=True, reasons=["malformed_json"])
add("wrong_key", '{"score": [1, 0, 1, 0, 1]}', 5, [None] * 5, malformed=True, reasons=["malformed_json"])
add("scores_not_a_list", '{"scores": 0.8}', 5, [None] * 5, malformed=True, reasons=["malformed_json"])
add("single_quotes_python_dict", "{'scores': [1, 0, 1, 0, 1]}", 5, [None] * 5, malformed=True,
    reasons=["malformed_json"])
add("bare_list", "[1, 0, 1, 0, 1]", 5, [None] * 5, malformed=True, reasons=["malformed_json"])
add("two_objects_first_with_scores", '{"note": 1} then {"scores": [1, 1, 1, 1, 1]} and {"scores": [0,0,0,0,0]}',
    5, [1, 1, 1, 1, 1])
# per group
add("group_clean", '{"scores": [[1, 0, 1, 0, 1], [0, 0, 0, 0, 0], [0.5, 0.5, 0.5, 0.5, 0.5]]}', 5,
    [[1, 0, 1, 0, 1], [0, 0, 0, 0, 0], [0.5, 0.5, 0.5, 0.5, 0.5]], mode="per_group", n=3)
add("group_missing_row", '```json\n{"scores": [[1, 0, 1, 0, 1], [0, 0, 0, 0, 0]]}\n```', 5,
    [[1, 0, 1, 0, 1], [0, 0, 0, 0, 0], [None] * 5], reasons=["missing_score"], mode="per_group", n=3)
add("group_extra_row_and_short_row", '{"scores": [[1, 0, 1, 0, 1], [0, 0, 0], [2, 2, 2, 2, 2], [1, 1, 1, 1, 1]]}', 5,
    [[1, 0, 1, 0, 1], [0, 0, 0, None, None], [1, 1, 1, 1, 1]], reasons=["missing_score", "extra_score"],
    clamped=5, mode="per_group", n=3)
add("group_row_not_a_list", '{"scores": [[1, 0, 1, 0, 1], "n/a", [0, 0, 0, 0, 0]]}', 5,
    [[1, 0, 1, 0, 1], [None] * 5, [0, 0, 0, 0, 0]], reasons=["unparsable_score"], mode="per_group", n=3)
add("group_flat_list", '{"scores": [1, 0, 1, 0, 1]}', 5, [[None] * 5] * 3,
    reasons=["unparsable_score", "extra_score"], mode="per_group", n=3)
add("group_garbage", "I cannot grade these.", 5, [[None] * 5] * 3, malformed=True, reasons=["malformed_json"],
    mode="per_group", n=3)

with open(Path(__file__).with_name("verifier_answers.jsonl"), "w", encoding="utf-8") as out:
    for case in cases:
        out.write(json.dumps(case, ensure_ascii=False) + "\n")
print(len(cases), "cases")
