"""LocalVerifier end to end with a tiny random Qwen3 (tests/tiny_model.py), both scoring modes."""

import asyncio

import numpy as np
import pytest
import torch

from orsd.rubric import LocalVerifier, RubricBundle, answer_token_ids, yes_no_messages

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TASK = "Put a clean apple in the fridge."
TRANSCRIPTS = [
    "Observation 0: You are in the middle of a room.\nAction 1: go to countertop 1\n"
    "Observation 1: On the countertop 1, you see an apple 1.",
    "Observation 0: You are in the middle of a room.\nAction 1: (invalid action: no well-formed command)\n"
    "Observation 1: Nothing happens.",
    "Observation 0: You are in the kitchen.\nAction 1: open fridge 1\nObservation 1: The fridge 1 is open.",
]
BUNDLES = [
    RubricBundle(["The agent goes to the countertop first", "The agent takes the apple",
                  "The agent cleans the apple in the sink", "The agent opens the fridge",
                  "The agent does not repeat failed actions"]),
    RubricBundle(["The agent checks every receptacle", "The agent uses valid commands only",
                  "The agent stops after placing the apple", "The agent reads each observation",
                  "The agent avoids aimless moves", "The agent finds the apple quickly"]),
]


def by_hand(model, tokenizer, transcript, criterion, yes_ids, no_ids):
    """P(yes)/(P(yes)+P(no)) from one plain forward of the whole prompt, no cache, no batching."""
    text = tokenizer.apply_chat_template(yes_no_messages(TASK, transcript, criterion), tokenize=False,
                                         add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0, -1].double(), dim=-1)
    p_yes, p_no = probs[yes_ids].sum().item(), probs[no_ids].sum().item()
    return p_yes / (p_yes + p_no)


def test_yes_no_token_ids_follow_the_documented_rule(tiny_tokenizer):
    yes_ids, no_ids = answer_token_ids(tiny_tokenizer)
    expected_yes, expected_no = set(), set()
    for words, out in ((("yes", "Yes", "YES"), expected_yes), (("no", "No", "NO"), expected_no)):
        for word in words:
            for variant in (word, " " + word):
                first = tiny_tokenizer.encode(variant, add_special_tokens=False)[0]
                piece = tiny_tokenizer.decode([first]).strip().lower()
                if piece and word.lower().startswith(piece):
                    out.add(first)
    assert set(yes_ids) == expected_yes and set(no_ids) == expected_no
    assert tiny_tokenizer.convert_tokens_to_ids("yes") in yes_ids
    assert not set(yes_ids) & set(no_ids)


def test_yes_prob_equals_hand_computation(tiny_model, tiny_tokenizer):
    verifier = LocalVerifier(tiny_model, tiny_tokenizer, scoring="yes_prob", batch_size=3)
    scores = verifier.score(TASK, TRANSCRIPTS, BUNDLES[0])
    assert scores.shape == (3, 5) and np.isfinite(scores).all()
    expected = np.array([[by_hand(tiny_model, tiny_tokenizer, t, c, verifier.yes_ids, verifier.no_ids)
                          for c in BUNDLES[0].criteria] for t in TRANSCRIPTS])
    np.testing.assert_allclose(scores, expected, rtol=0, atol=2e-6)
    # the comparison is sharp only if the values differ from cell to cell
    assert np.ptp(expected) > 0.01
    stats = verifier.stats()
    assert stats["requests"] == stats["succeeded"] == 15 and stats["failed"] == 0
    assert stats["cells_scored"] == 15 and verifier.drain_events() == []


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_yes_prob_independent_of_batching_and_bundles_shared(tiny_model, tiny_tokenizer, batch_size):
    reference = LocalVerifier(tiny_model, tiny_tokenizer, batch_size=4)
    separate = [reference.score(TASK, TRANSCRIPTS, bundle) for bundle in BUNDLES]
    verifier = LocalVerifier(tiny_model, tiny_tokenizer, batch_size=batch_size)
    together = verifier.score_many(TASK, TRANSCRIPTS, BUNDLES)
    assert [s.shape for s in together] == [(3, 5), (3, 6)]
    for a, b in zip(separate, together):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)


def test_json_mode_nonsense_is_recorded_not_raised(tiny_model, tiny_tokenizer):
    verifier = LocalVerifier(tiny_model, tiny_tokenizer, scoring="json", max_new_tokens=12, batch_size=2)
    result = asyncio.run(verifier.ascore_with_events(TASK, TRANSCRIPTS, BUNDLES[0], bundle_index=1))
    assert result.scores.shape == (3, 5)
    unscored_rows = [i for i in range(3) if np.isnan(result.scores[i]).any()]
    # a random model cannot write {"scores": [...]}; every unscored cell has a recorded reason
    assert unscored_rows == [0, 1, 2]
    assert {(e.trajectory, e.reason, e.bundle) for e in result.events} == {
        (i, "malformed_json", 1) for i in range(3)}
    assert all("after one corrective re-ask" in e.detail for e in result.events)
    stats = verifier.stats()
    assert stats["requests"] == 3 and stats["reasks"] == 3 and stats["failed"] == 3
    assert stats["failures_by_reason"] == {"malformed_json": 3}
    assert 0 < stats["completion_tokens"] <= 6 * 12


def test_json_mode_per_group(tiny_model, tiny_tokenizer):
    verifier = LocalVerifier(tiny_model, tiny_tokenizer, mode="per_group", scoring="json", max_new_tokens=8)
    scores = verifier.score(TASK, TRANSCRIPTS, BUNDLES[1])
    assert scores.shape == (3, 6) and np.isnan(scores).all()
    assert verifier.stats()["requests"] == 1
    assert [e.reason for e in verifier.drain_events()] == ["malformed_json"]


def test_prompt_too_long_is_recorded(tiny_model, tiny_tokenizer):
    verifier = LocalVerifier(tiny_model, tiny_tokenizer, max_prompt_tokens=40)
    scores = verifier.score(TASK, TRANSCRIPTS[:1], BUNDLES[0])
    assert np.isnan(scores).all()
    events = verifier.drain_events()
    assert len(events) == 5 and {e.reason for e in events} == {"prompt_too_long"}
    json_verifier = LocalVerifier(tiny_model, tiny_tokenizer, scoring="json", max_prompt_tokens=40)
    assert np.isnan(json_verifier.score(TASK, TRANSCRIPTS[:1], BUNDLES[0])).all()
    assert [e.reason for e in json_verifier.drain_events()] == ["prompt_too_long"]


def test_autocast_reaches_the_forwards_on_the_worker_thread(tiny_model, tiny_tokenizer):
    """Autocast is per thread and score() runs the forwards on a worker thread: the verifier's own
    autocast_dtype must apply there. A copy whose linear weights are stored in bf16 then scores as
    the fp32 model does under bf16 autocast, and fails without it (fp32 inputs, bf16 weights)."""
    from orsd.train.model import frozen_copy

    bf16_weights = frozen_copy(tiny_model, "bfloat16")
    assert bf16_weights.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    stored = LocalVerifier(bf16_weights, tiny_tokenizer, autocast_dtype=torch.bfloat16)
    cast = LocalVerifier(tiny_model, tiny_tokenizer, autocast_dtype=torch.bfloat16)
    plain = LocalVerifier(tiny_model, tiny_tokenizer)
    a, b, c = (v.score(TASK, TRANSCRIPTS, BUNDLES[0]) for v in (stored, cast, plain))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0  # bf16 really ran
    with pytest.raises(RuntimeError):
        LocalVerifier(bf16_weights, tiny_tokenizer).score(TASK, TRANSCRIPTS, BUNDLES[0])


def test_frozen_model_untouched(tiny_model, tiny_tokenizer):
    before = {name: p.detach().clone() for name, p in tiny_model.named_parameters()}
    LocalVerifier(tiny_model, tiny_tokenizer).score(TASK, TRANSCRIPTS[:1], BUNDLES[0])
    assert not tiny_model.training
    for name, p in tiny_model.named_parameters():
        assert p.grad is None and torch.equal(p, before[name])


def test_configuration_errors(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="per_trajectory"):
        LocalVerifier(tiny_model, tiny_tokenizer, mode="per_group", scoring="yes_prob")
    with pytest.raises(ValueError, match="batch_size"):
        LocalVerifier(tiny_model, tiny_tokenizer, batch_size=0)
    with pytest.raises(ValueError, match="no token starts"):
        LocalVerifier(tiny_model, tiny_tokenizer, yes_words=("\u2603\u2603",))
