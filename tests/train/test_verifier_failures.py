"""A verifier that fails every call (real HTTP on loopback answering 500): the step completes as
GRPO for those groups, and the records say why."""

from orsd.rubric import OpenAIVerifier
from helpers.fake_server import FakeChatServer, Reply
from orsd.train.model import frozen_copy
from orsd.train.build import make_env
from orsd.train.trainer import Trainer
from scripted import ScriptedEngine, small_config


def test_failing_verifier_degrades_to_grpo(tiny_model, tiny_tokenizer):
    config = small_config("method.name=orsd")
    with FakeChatServer(lambda request: Reply.error(500)) as server:
        verifier = OpenAIVerifier(server.url, "judge", max_retries=1, backoff_base_seconds=0.001,
                                  backoff_max_seconds=0.002)
        trainer = Trainer(config, tiny_model, tiny_tokenizer, frozen_copy(tiny_model), verifier, make_env(config),
                          engine=ScriptedEngine(tiny_model, tiny_tokenizer))
        result = trainer.step()
        requests = len(server.requests)
    m = result.metrics
    assert requests > 0
    assert m["groups_with_bundle"] == 0.0 and m["valid_token_fraction"] == 0.0
    assert m["delta_abs_mean"] == 0.0
    assert m["verifier"]["failed"] > 0 and m["verifier"]["retries"] > 0 and m["verifier"]["cells_scored"] == 0
    assert m["update_tokens"] == m["response_tokens"]  # the update still ran on every token
    out = result.outputs
    for candidates, scores, selection, record in zip(out.candidates, out.scores, out.selection, result.records):
        assert candidates.bundles and selection.index is None and record["selected"] is None
        assert record["verifier_events"], "each failed cell is recorded with its group"
        assert all(e["reason"] for e in record["verifier_events"])
        assert selection.reason and record["reason"]  # says why no bundle was used
        assert all(s.scores.size and (s.scores != s.scores).all() for s in scores)  # every cell unscored (NaN)
