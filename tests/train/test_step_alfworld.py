"""The step and the evaluation on the real ALFWorld engine (small generated task set)."""

import pytest

pytest.importorskip("alfworld", reason="the [alfworld] extra is not installed")

from orsd.envs.alfworld import generator as alfworld_generator  # noqa: E402
from orsd.engines.base import Sampling  # noqa: E402
from orsd.train.evaluate import evaluate  # noqa: E402
from orsd.train.rollout import Episodes  # noqa: E402
from orsd.train.model import frozen_copy, load_policy  # noqa: E402
from orsd.train.build import make_env
from orsd.train.trainer import Trainer  # noqa: E402
from orsd.train.build import build_verifier  # noqa: E402
from scripted import ExpertReplayEngine, small_config  # noqa: E402

SIZES = {"train": 6, "valid_seen": 6, "valid_unseen": 6}


@pytest.fixture(scope="module")
def alfworld_options(tmp_path_factory):
    cache = tmp_path_factory.mktemp("alfworld-tasks")
    alfworld_generator.prepare(cache, 0, SIZES, num_workers=2)
    return [f"env.options={{split_sizes: {SIZES}, cache_dir: '{cache}'}}"]


@pytest.mark.slow
def test_orsd_step_on_alfworld(alfworld_options, tiny_smol_dir, smol_tokenizer, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    config = small_config("env.name=alfworld", "env.max_actions=20", "env.max_history_turns=0", "rollout.max_new_tokens=24",
                          "rollout.max_context_tokens=8192", *alfworld_options)
    policy = load_policy(str(tiny_smol_dir), device="cpu")
    reference = frozen_copy(policy)
    env = make_env(config)
    engine = ExpertReplayEngine(smol_tokenizer, env, lambda task, sample: sample % 2 == 0)
    trainer = Trainer(config, policy, smol_tokenizer, reference, build_verifier(config, reference, smol_tokenizer),
                      env, engine=engine)
    result = trainer.step()
    for group, candidates, scores in zip(result.groups, result.outputs.candidates, result.outputs.scores):
        for sample, trajectory in enumerate(group.trajectories):
            assert not trajectory.error
            assert len(trajectory.records) == len(trajectory.actions) >= 1
            assert trajectory.won == (sample % 2 == 0)  # the planner expert wins within 20 actions
            assert trajectory.reward == float(trajectory.won)  # Eq. 12
        assert group.rewards_differ and candidates.bundles and len(scores) == 2
    assert result.metrics["groups_rewards_differ"] == 1.0
    assert result.metrics["update_tokens"] == result.metrics["response_tokens"] > 0


@pytest.mark.slow
def test_alfworld_eval_success_per_task_type(alfworld_options, smol_tokenizer, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    config = small_config("env.name=alfworld", "env.max_actions=20", "env.max_history_turns=0", *alfworld_options)
    from orsd.train.evaluate import make_eval_env

    env = make_eval_env(config, "valid_unseen")
    kinds = sorted({t.kind for t in env.tasks("valid_unseen")})
    chosen = set(kinds[::2])
    engine = ExpertReplayEngine(smol_tokenizer, env, lambda task, sample: task.kind in chosen, "valid_unseen")
    result = evaluate(engine, smol_tokenizer, env, "valid_unseen", 6,
                      Episodes(1, Sampling(0.6, max_new_tokens=24), 8192, max_actions=20))
    assert result["num_episodes"] == 6
    assert set(result["per_kind"]) == set(kinds)
    for kind, row in result["per_kind"].items():
        assert row["success_rate"] == (1.0 if kind in chosen else 0.0), kind
    assert result["success_rate"] == pytest.approx(len(chosen) / len(kinds))
