"""env.train_tasks: a run samples its steps' tasks from a fixed pool, the same for every seed."""

from orsd.train.build import make_env
from orsd.train.model import frozen_copy
from orsd.train.trainer import Trainer
from scripted import small_config


def trainer_of(tiny_model, tiny_tokenizer, *overrides):
    config = small_config(*overrides)
    return Trainer(config, tiny_model, tiny_tokenizer, frozen_copy(tiny_model), None, make_env(config))


def test_steps_sample_only_the_pool_and_every_seed_shares_it(tiny_model, tiny_tokenizer):
    drawn = {}
    for seed in (0, 1):
        trainer = trainer_of(tiny_model, tiny_tokenizer, "env.train_tasks=3", "rollout.tasks_per_step=2",
                             f"train.seed={seed}")
        pool = {t.id for t in trainer.env.task_pool(3)}
        drawn[seed] = [t.id for _ in range(20) for t in trainer.sample_tasks()]
        assert set(drawn[seed]) == pool  # 40 draws from 3 tasks: each is drawn, nothing else is
    assert drawn[0] != drawn[1]  # the seed still orders the draws


def test_without_a_pool_the_whole_split_is_sampled_as_before(tiny_model, tiny_tokenizer):
    trainer = trainer_of(tiny_model, tiny_tokenizer, "rollout.tasks_per_step=2")
    rng = trainer.task_rng.__class__()
    rng.setstate(trainer.task_rng.getstate())
    expected = [trainer.env.sample_task(rng).id for _ in range(2)]
    assert [t.id for t in trainer.sample_tasks()] == expected
