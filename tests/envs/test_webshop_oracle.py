"""The oracle rubric of a shop task (orsd.envs.webshop.oracle) and the fixed training pool
(Env.task_pool, env.train_tasks)."""

import yaml

from orsd.envs import make
from orsd.envs.webshop.oracle import main, oracle_rubric
from orsd.rubric import MAX_CRITERIA, MIN_CRITERIA, RubricBundle


def test_oracle_rubric_names_what_the_goal_asks_for():
    env = make("webshop", split="train")
    for task in env.tasks("train")[:50]:
        goal = task.payload["goal"]
        criteria = oracle_rubric(task)
        assert MIN_CRITERIA <= len(criteria) <= MAX_CRITERIA
        text = " ".join(criteria)
        assert goal["query"] in text and f"{goal['price_upper']:.2f}" in text
        for name, value in goal["goal_options"]:
            assert f'the {name} option "{value}"' in text
        # a bundle's form: it parses back to itself as the policy's numbered list would
        parsed = RubricBundle.parse("\n".join(f"{i}. {c}" for i, c in enumerate(criteria, 1)))
        assert parsed is not None and parsed.criteria == criteria


def test_task_pool_is_fixed_by_its_size_alone():
    env = make("webshop", split="train")
    pool = env.task_pool(8)
    assert len(pool) == 8 and len({t.id for t in pool}) == 8
    assert [t.id for t in make("webshop", split="train").task_pool(8)] == [t.id for t in pool]
    assert {t.id for t in env.task_pool(16)} != {t.id for t in pool}
    assert len(env.task_pool(0)) == len(env.tasks("train"))
    assert all(t.split == "train" for t in pool)


def test_oracle_cli_writes_the_pool_rubric_file(tmp_path):
    out = tmp_path / "oracle.yaml"
    assert main(["--train-tasks", "4", "--out", str(out)]) == 0
    rubrics = yaml.safe_load(out.read_text())
    pool = make("webshop", split="train").task_pool(4)
    assert list(rubrics) == [t.id for t in pool]
    assert rubrics[pool[0].id] == oracle_rubric(pool[0])
