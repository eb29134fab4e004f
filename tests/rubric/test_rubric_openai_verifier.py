"""OpenAIVerifier against a real HTTP server on loopback, with injected faults."""

import asyncio
import logging
import math
import re
import time

import numpy as np
import pytest

from orsd.rubric import OpenAIVerifier, RubricBundle, VerifierRequestError, parse_retry_after
from helpers.fake_server import FakeChatServer, Reply, num_attempts_asked, num_criteria_asked, scores_answer

KEY_ENV = "ORSD_TEST_VERIFIER_KEY"
KEY = "sk-test-7f3a9c2e51d84b6f"
TASK = "Put a clean apple in the fridge."
BUNDLE = RubricBundle([f"The agent performs observable step number {i} of the plan" for i in range(1, 6)])
K = len(BUNDLE)


def transcripts(n):
    return [f"Observation 0: trajectory {i} starts in the kitchen.\nAction 1: go to fridge 1" for i in range(n)]


def trajectory_of(request):
    return int(re.search(r"trajectory (\d+)", request.prompt).group(1))


def row_for(i, k=K):
    return [round(0.1 * ((i + c) % 10), 2) for c in range(k)]


def good(request):
    k = num_criteria_asked(request)
    return Reply.ok(scores_answer(row_for(trajectory_of(request), k)), delay_seconds=0.005)


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def make(server, **kwargs):
    options = dict(api_key_env=KEY_ENV, backoff_base_seconds=0.01, backoff_max_seconds=0.05, timeout=2.0)
    options.update(kwargs)
    return OpenAIVerifier(server.url, "judge-model", **options)


def test_scores_shape_values_and_bearer_header(key):
    with FakeChatServer(good) as server:
        verifier = make(server)
        scores = verifier.score(TASK, transcripts(4), BUNDLE)
    np.testing.assert_allclose(scores, np.array([row_for(i) for i in range(4)]))
    assert len(server.requests) == 4
    for request in server.requests:
        assert request.headers["Authorization"] == f"Bearer {KEY}"
        assert request.path == "/v1/chat/completions"
        body = request.body
        assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_tokens"] == 1536
        assert body["response_format"] == {"type": "json_object"}
    stats = verifier.stats()
    assert stats["requests"] == stats["succeeded"] == stats["http_attempts"] == 4
    assert stats["cells_scored"] == 4 * K and stats["prompt_tokens"] > 0 and stats["completion_tokens"] > 0
    assert stats["latency_seconds_p50"] <= stats["latency_seconds_p90"] <= stats["latency_seconds_p99"]


def test_every_request_ends_scored_or_recorded_failed(key):
    """One trajectory per fault kind; the last never recovers."""
    def responder(request):
        i, attempt = trajectory_of(request), request.attempt
        if i == 0 and attempt == 0:
            return Reply.error(429, retry_after="0.2")
        if i == 1 and attempt < 2:
            return Reply.error(500 if attempt == 0 else 503)
        if i == 2 and attempt == 0:
            return Reply.hang(0.8)
        if i == 3 and attempt == 0:
            return Reply.drop()
        if i == 4 and attempt == 0:
            return Reply.garbage()
        if i == 5:  # prose first; the corrective re-ask (a new conversation) gets JSON
            if len(request.body["messages"]) == 1:
                return Reply.ok("The agent mostly followed the rubric, I would say 4 out of 5.")
            return good(request)
        if i == 6:  # missing, out-of-range and unparsable scores
            return Reply.ok('{"scores": [1.7, -1, "n/a"]}')
        if i == 7:
            return Reply.error(503)
        if i == 8:  # garbage content even after the re-ask
            return Reply.ok("Sorry, I cannot help with grading.")
        return good(request)

    with FakeChatServer(responder) as server:
        verifier = make(server, max_retries=3, timeout=0.3)
        result = asyncio.run(verifier.ascore_with_events(TASK, transcripts(10), BUNDLE))
    scores, events = result.scores, result.events
    for i in (0, 1, 2, 3, 4, 5, 9):
        np.testing.assert_allclose(scores[i], row_for(i))
    np.testing.assert_array_equal(scores[6], [1.0, 0.0, np.nan, np.nan, np.nan])
    assert np.isnan(scores[7]).all() and np.isnan(scores[8]).all()
    by_cell = {(e.trajectory, e.criterion): e.reason for e in events}
    assert by_cell == {(6, 2): "unparsable_score", (6, 3): "missing_score", (6, 4): "missing_score",
                       (7, None): "http_503", (8, None): "malformed_json"}
    # every NaN cell is explained by an event
    for i, k in zip(*np.nonzero(np.isnan(scores))):
        assert (int(i), int(k)) in by_cell or (int(i), None) in by_cell
    # retries honour the limit: trajectory 7 was tried exactly 1 + max_retries times
    assert sum(trajectory_of(r) == 7 for r in server.requests) == 4
    stats = verifier.stats()
    assert stats["requests"] == 10 and stats["succeeded"] == 8 and stats["failed"] == 2
    assert stats["failures_by_reason"] == {"http_503": 1, "malformed_json": 1}
    assert stats["retries"] == 1 + 2 + 1 + 1 + 1 + 3  # 429, 500+503, timeout, drop, garbage, 503 x3
    assert stats["reasks"] == 2 and stats["scores_clamped"] == 2
    assert stats["cells_unscored"] == 3 + 5 + 5
    # the 429's Retry-After was waited out
    first, second = [r.arrived for r in server.requests if trajectory_of(r) == 0]
    assert second - first >= 0.2
    # the re-ask carried the bad answer back to the verifier
    reask = [r for r in server.requests if trajectory_of(r) == 5 and len(r.body["messages"]) == 3][0]
    assert reask.body["messages"][1]["role"] == "assistant" and "4 out of 5" in reask.body["messages"][1]["content"]
    assert verifier.drain_events() == events and verifier.drain_events() == []


def test_non_retryable_status_fails_at_once(key):
    with FakeChatServer(lambda request: Reply.error(401, body='{"error": "bad key"}')) as server:
        verifier = make(server)
        scores = verifier.score(TASK, transcripts(2), BUNDLE)
    assert np.isnan(scores).all() and len(server.requests) == 2
    assert verifier.stats()["failures_by_reason"] == {"http_401": 2}
    assert {e.reason for e in verifier.drain_events()} == {"http_401"}


def test_response_format_rejected_falls_back_once(key):
    def responder(request):
        if "response_format" in request.body:
            return Reply.error(400, body='{"error": "unknown field response_format"}')
        return good(request)

    with FakeChatServer(responder) as server:
        verifier = make(server, concurrency=1)
        scores = verifier.score(TASK, transcripts(3), BUNDLE)
    assert np.isfinite(scores).all()
    with_format = [r for r in server.requests if "response_format" in r.body]
    assert len(with_format) == 1 and len(server.requests) == 4  # later requests no longer send it
    assert verifier.stats()["response_format_fallbacks"] == 1


def test_in_flight_requests_never_exceed_concurrency(key):
    def slow(request):
        return Reply.ok(scores_answer(row_for(trajectory_of(request))), delay_seconds=0.04)

    bundles = [RubricBundle([f"Criterion {m}-{c} is about an observable step" for c in range(5)]) for m in range(4)]
    with FakeChatServer(slow) as server:
        verifier = make(server, concurrency=3)
        results = verifier.score_many(TASK, transcripts(8), bundles)
    assert len(results) == 4 and all(np.isfinite(r).all() for r in results)
    assert len(server.requests) == 32
    assert server.max_in_flight == 3  # reached (so the test can see a breach) and never exceeded


def test_concurrency_holds_when_requests_time_out(key):
    """A timed-out request frees its slot; the server sees the client leave and stops counting it."""
    def responder(request):
        if request.attempt == 0 and trajectory_of(request) % 2 == 0:
            return Reply.hang(0.5)
        return Reply.ok(scores_answer(row_for(trajectory_of(request))), delay_seconds=0.03)

    with FakeChatServer(responder) as server:
        verifier = make(server, concurrency=3, timeout=0.15)
        scores = verifier.score(TASK, transcripts(8), BUNDLE)
    assert np.isfinite(scores).all() and verifier.stats()["retries"] == 4
    assert server.abandoned == 4 and server.max_in_flight <= 3


def test_cache_hits_skip_the_network(key, tmp_path):
    calls = {"fail": True}

    def responder(request):
        if trajectory_of(request) == 2 and calls["fail"]:
            return Reply.error(503)
        return good(request)

    with FakeChatServer(responder) as server:
        first = make(server, cache_dir=tmp_path, max_retries=0)
        a = first.score(TASK, transcripts(3), BUNDLE)
        assert np.isnan(a[2]).all() and len(server.requests) == 3  # failures are not cached
        calls["fail"] = False
        second = make(server, cache_dir=tmp_path)
        b = second.score(TASK, transcripts(3), BUNDLE)
        assert len(server.requests) == 4  # only the failed one went out again
        third = make(server, cache_dir=tmp_path)
        c = third.score(TASK, transcripts(3), BUNDLE)
        assert len(server.requests) == 4
    np.testing.assert_array_equal(a[:2], b[:2])
    np.testing.assert_array_equal(b, c)
    assert second.stats()["cache_hits"] == 2 and third.stats()["cache_hits"] == 3
    assert third.stats()["http_attempts"] == 0
    assert KEY not in "".join(p.read_text() for p in tmp_path.rglob("*.json"))


def test_a_different_model_or_sampling_misses_the_cache(key, tmp_path):
    with FakeChatServer(good) as server:
        make(server, cache_dir=tmp_path).score(TASK, transcripts(1), BUNDLE)
        OpenAIVerifier(server.url, "other-model", api_key_env=KEY_ENV, cache_dir=tmp_path).score(
            TASK, transcripts(1), BUNDLE)
        make(server, cache_dir=tmp_path, max_tokens=64).score(TASK, transcripts(1), BUNDLE)
        assert len(server.requests) == 3


def test_per_group_mode_one_request_per_bundle(key):
    def responder(request):
        n, k = num_attempts_asked(request), num_criteria_asked(request)
        return Reply.ok(scores_answer([row_for(i, k) for i in range(n)]))

    with FakeChatServer(responder) as server:
        verifier = make(server, mode="per_group")
        scores = verifier.score(TASK, transcripts(5), BUNDLE)
    np.testing.assert_allclose(scores, [row_for(i) for i in range(5)])
    assert len(server.requests) == 1


def test_yes_prob_through_top_logprobs(key):
    def responder(request):
        if "trajectory 2" in request.prompt:
            return Reply.ok("Sure", top_logprobs=[("Sure", -0.1), ("I", -2.5)])
        if "trajectory 3" in request.prompt:
            return Reply.ok("yes")  # a server that ignores logprobs
        return Reply.ok("yes", top_logprobs=[("yes", math.log(0.5)), (" Yes", math.log(0.1)),
                                             ("no", math.log(0.2)), ("maybe", math.log(0.1))])

    with FakeChatServer(responder) as server:
        verifier = make(server, scoring="yes_prob")
        scores = verifier.score(TASK, transcripts(4), BUNDLE)
    np.testing.assert_allclose(scores[:2], np.full((2, K), 0.6 / 0.8))
    assert np.isnan(scores[2:]).all()
    body = server.requests[0].body
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["max_tokens"] == 1
    assert "response_format" not in body and len(server.requests) == 4 * K
    assert verifier.stats()["failures_by_reason"] == {"logprobs_missing": K, "no_yes_no_token": K}


def test_retry_after_header_parsing():
    assert parse_retry_after("2") == 2.0 and parse_retry_after("0.25") == 0.25
    assert parse_retry_after("-3") == 0.0 and parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert 50 < parse_retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT",
                                                time.gmtime(time.time() + 60))) <= 61


def test_backoff_grows_and_honours_retry_after(key):
    verifier = OpenAIVerifier("http://127.0.0.1:9/v1", "m", backoff_base_seconds=0.1, backoff_max_seconds=0.5)
    delays = [verifier.client.backoff_seconds(attempt, None) for attempt in range(5)]
    for attempt, delay in enumerate(delays):
        step = min(0.5, 0.1 * 2 ** attempt)
        assert step / 2 <= delay <= step
    assert verifier.client.backoff_seconds(0, 3.0) == 3.0
    assert verifier.client.backoff_seconds(0, 1e9) == verifier.client.max_retry_after_seconds


def test_api_key_appears_in_no_log_record_stats_or_error(key, caplog):
    def responder(request):
        if trajectory_of(request) == 0:
            return Reply.error(401, body=f'{{"error": "Incorrect API key provided: {KEY}"}}')
        if trajectory_of(request) == 1 and request.attempt == 0:
            return Reply.error(500, body=f"upstream said {KEY}")
        return good(request)

    caplog.set_level(logging.DEBUG)
    with FakeChatServer(responder) as server:
        verifier = make(server, max_retries=1)
        scores = verifier.score(TASK, transcripts(3), BUNDLE)
        assert np.isnan(scores[0]).all() and np.isfinite(scores[1:]).all()
        error = None
        try:
            asyncio.run(_one_failing_request(verifier))
        except VerifierRequestError as caught:
            error = caught
    assert server.requests[0].headers["Authorization"] == f"Bearer {KEY}"
    assert error is not None and error.reason == "http_401"
    texts = [record.getMessage() for record in caplog.records]
    texts += [repr(verifier), str(verifier.stats()), str(error), repr(error), error.detail]
    texts += [repr(e) for e in verifier.drain_events()]
    texts += [repr(vars(verifier))]
    assert any("redacted" in t for t in texts)  # the echoed key was seen and scrubbed
    assert not [t for t in texts if KEY in t]


async def _one_failing_request(verifier):
    try:
        await verifier.client.complete({"messages": [{"role": "user", "content": "trajectory 0"}],
                                        "temperature": 0.0, "max_tokens": 16})
    finally:
        await verifier.aclose()


def test_missing_key_variable_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=KEY_ENV):
        OpenAIVerifier("http://127.0.0.1:9/v1", "m", api_key_env=KEY_ENV)


@pytest.mark.parametrize("kwargs, match", [
    ({"base_url": "localhost:8000"}, "base_url"), ({"concurrency": 0}, "concurrency"),
    ({"max_retries": -1}, "max_retries"), ({"timeout": 0}, "timeout"), ({"mode": "batch"}, "mode"),
    ({"scoring": "yes_prob", "mode": "per_group"}, "per_trajectory"), ({"response_format": "xml"}, "response_format")])
def test_bad_configuration(kwargs, match):
    options = {"base_url": "http://127.0.0.1:9/v1", "model": "m", **kwargs}
    with pytest.raises(ValueError, match=match):
        OpenAIVerifier(**options)


def test_blocking_score_inside_a_running_loop(key):
    with FakeChatServer(good) as server:
        verifier = make(server)

        async def inside():
            return verifier.score(TASK, transcripts(2), BUNDLE)

        scores = asyncio.run(inside())
    np.testing.assert_allclose(scores, [row_for(0), row_for(1)])


def test_connection_refused_is_recorded(key):
    verifier = OpenAIVerifier("http://127.0.0.1:9/v1", "m", api_key_env=KEY_ENV, max_retries=1,
                              backoff_base_seconds=0.01)
    scores = verifier.score(TASK, transcripts(2), BUNDLE)
    assert np.isnan(scores).all()
    assert verifier.stats()["failures_by_reason"] == {"connection": 2}
