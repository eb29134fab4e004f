import json

import pytest

from orsd.rubric import Accounting, ResponseCache, VerifierEvent, cache_key


def test_cache_round_trip_and_damaged_entry(tmp_path, caplog):
    cache = ResponseCache(tmp_path / "c")
    key = cache_key("m", [{"role": "user", "content": "q"}], {"temperature": 0.0})
    assert cache.get(key) is None
    cache.put(key, {"content": '{"scores": [1]}'})
    assert cache.get(key) == {"content": '{"scores": [1]}'} and len(cache) == 1
    path = next((tmp_path / "c").rglob("*.json"))
    path.write_text("{not json", encoding="utf-8")
    assert cache.get(key) is None and "unreadable" in caplog.text
    assert not list((tmp_path / "c").rglob(".tmp-*"))  # no temporary file left behind


def test_cache_key_depends_on_everything_that_shapes_the_answer():
    base = cache_key("m", [{"role": "user", "content": "q"}], {"temperature": 0.0, "max_tokens": 9})
    assert base == cache_key("m", [{"content": "q", "role": "user"}], {"max_tokens": 9, "temperature": 0.0})
    assert base != cache_key("n", [{"role": "user", "content": "q"}], {"temperature": 0.0, "max_tokens": 9})
    assert base != cache_key("m", [{"role": "user", "content": "q!"}], {"temperature": 0.0, "max_tokens": 9})
    assert base != cache_key("m", [{"role": "user", "content": "q"}], {"temperature": 0.5, "max_tokens": 9})


def test_accounting_stats_and_events():
    accounting = Accounting()
    assert accounting.stats()["latency_seconds_p50"] is None
    accounting.add("requests", 3)
    accounting.request_failed("timeout")
    for seconds in (0.1, 0.2, 0.3, 0.4):
        accounting.latency(seconds)
    accounting.record([VerifierEvent("timeout", 1, None, 0, "x")])
    stats = accounting.stats(reset=True)
    assert stats["requests"] == 3 and stats["failed"] == 1 and stats["failures_by_reason"] == {"timeout": 1}
    assert stats["latency_seconds_p50"] == pytest.approx(0.25)
    assert json.dumps(stats)  # JSON-ready for steps.jsonl
    assert accounting.stats()["requests"] == 0
    assert [e.to_dict() for e in accounting.drain_events()] == [
        {"reason": "timeout", "trajectory": 1, "criterion": None, "bundle": 0, "detail": "x"}]
    assert accounting.drain_events() == []
    with pytest.raises(ValueError, match="name="):
        accounting.add("request")
