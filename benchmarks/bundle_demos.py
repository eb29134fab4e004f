"""What the warm start's bundle demonstrations teach, for both kinds (warm_start.bundle_demos_kind):
the demonstrations themselves, no fit. For a config (default: the CPU study's), the warm start's own
bundle demonstrations (its seed and draws, as run_warm_start makes them) and `--per-task` more of
each of the config's training tasks (env.train_tasks), then per kind:

- criteria per demonstration, distinct criteria over all of them and per task, and the share of
  distinct criteria written for more than one task;
- the share of criteria that name something of their task (bundle_demos.names_task: its product,
  an attribute, an option value or its price limit), and of those naming each of these;
- content only: the share of criteria that the group's best episode meets and some worse one fails,
  by the writer's own rules (pool criteria have no rule).

    python benchmarks/bundle_demos.py [--config configs/cpu_study.yaml] [--per-task 4] [key=value ...]
    writes benchmarks/results/bundle_demos/demos.json

With `--policy DIR` (a warm-started policy, e.g. runs/<name>/checkpoints/reference) it measures what
that policy writes instead: for `--tasks` held-out tasks (env.eval_split), the bundle prompt of one
group (the expert and deviations, as a content demonstration's) sampled `--bundles` times with the
config's rubric sampling; per bundle whether it parses, and per criterion whether it names the task,
whether it is one the demonstration writer grounds for this group (a template filled with this task
and these episodes) and whether it is a line of the criteria pool. Writes policy_<name>.json (or --out).

With `--groups FILE...` (groups.jsonl of runs) it measures the bundles those runs' policies wrote
in training, the same way (no grounding: the groups' episodes are the policy's): e.g. the CPU
study's ORSD arm, whose policy was warm-started on the pool. Writes groups.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from orsd import envs
from orsd.envs.prompts import prompt_templates
from orsd.train.bundle_demos import (candidate_criteria, content_demo, content_demos, criteria_pool, goal_of,
                                     names_task, pool_demo, product_phrase)
from orsd.train.config import load_config
from orsd.train.model import load_tokenizer
from orsd.train.warmstart import collect_demos

OUT = Path(__file__).parent / "results" / "bundle_demos" / "demos.json"


class OneTask:
    """The env, except that every task drawn is `task` (pool demonstrations draw their own)."""

    def __init__(self, env, task):
        self.env, self.task = env, task

    def sample_task(self, rng, split=None):
        return self.task

    def __getattr__(self, name):
        return getattr(self.env, name)


def what_it_names(criterion: str, task) -> dict:
    goal, low = goal_of(task), criterion.lower()
    return {"product": product_phrase(goal).lower() in low or goal.query.lower() in low,
            "attribute": any(a.lower() in low for a in goal.attributes),
            "option": any(f'"{v.lower()}"' in low or f" {v.lower()}" in low for _, v in goal.goal_options),
            "price": f"{goal.price_upper:.2f}" in criterion}


def figures(demos: list) -> dict:
    """demos: (task, criteria, group episodes or None) per demonstration."""
    criteria = [(task, c) for task, cs, _ in demos for c in cs]
    by_task: dict[str, set] = {}
    for task, cs, _ in demos:
        by_task.setdefault(task.id, set()).update(cs)
    named = [what_it_names(c, t) for t, c in criteria]
    out = {"demonstrations": len(demos), "criteria": len(criteria),
           "criteria_per_demonstration": len(criteria) / len(demos),
           "distinct_criteria": len({c for _, c in criteria}),
           "tasks": len(by_task),
           "distinct_criteria_per_task_mean": statistics.mean(len(s) for s in by_task.values()),
           # a line written for several tasks says nothing of any one of them
           "share_of_distinct_criteria_in_several_tasks": (
               sum(sum(c in s for s in by_task.values()) > 1 for c in {c for _, c in criteria})
               / len({c for _, c in criteria})),
           "share_naming_the_task": sum(names_task(c, t) for t, c in criteria) / len(criteria),
           "share_naming": {k: sum(n[k] for n in named) / len(named) for k in named[0]}}
    grouped = [(t, cs, eps) for t, cs, eps in demos if eps]
    if grouped:
        separating = total = 0
        for task, cs, episodes in grouped:
            rules = {text: rule for _, text, rule in candidate_criteria(ENV, task, episodes)}
            top = max(e.facts.score for e in episodes)
            for c in cs:
                met = [bool(rules[c](e.facts)) for e in episodes]
                separating += all(m for m, e in zip(met, episodes) if e.facts.score == top) and not all(met)
                total += 1
        out["share_met_by_the_best_and_failed_by_a_worse_episode"] = separating / total
    return out


def policy_figures(config, policy_dir: str, tasks: int, bundles: int) -> dict:
    """What the policy at `policy_dir` writes on held-out tasks' bundle prompts (see the docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from orsd import rubric

    r, e = config.rubric, config.env
    tokenizer = load_tokenizer(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, torch_dtype=torch.float32).eval()
    options = {**e.options, "max_actions": e.max_actions}
    held_out = envs.make(e.name, split=e.eval_split or "test", seed=e.seed, **options)
    rng, pool, rows = random.Random(5), set(criteria_pool(e.name)), []
    torch.manual_seed(0)
    for _ in range(tasks):
        task = held_out.sample_task(rng)
        demo = content_demo(held_out, tokenizer, task, config.rollout.group_size, r.transcript_chars, rng,
                            r.generation_template or None, e.max_actions)
        grounded = {text for _, text, _ in candidate_criteria(held_out, task, demo.episodes)}
        ids = torch.tensor([demo.prompt_ids])
        with torch.no_grad():
            out = model.generate(ids, do_sample=True, temperature=r.temperature, top_p=r.top_p, top_k=0,
                                 max_new_tokens=r.max_new_tokens, num_return_sequences=bundles,
                                 no_repeat_ngram_size=r.no_repeat_ngram_size or 0,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        for seq in out:
            text = tokenizer.decode(seq[ids.shape[1]:], skip_special_tokens=True)
            bundle = rubric.RubricBundle.parse(text)
            criteria = bundle.criteria if bundle is not None else []
            rows.append({"task": task.id, "description": task.description, "text": text, "parsed": bundle is not None,
                         "criteria": [{"text": c, "names_task": names_task(c, task), "grounded": c in grounded,
                                       "pool": c in pool} for c in criteria]})
    cells = [c for row in rows for c in row["criteria"]]
    by_task: dict[str, set] = {}
    for row in rows:
        by_task.setdefault(row["task"], set()).update(c["text"] for c in row["criteria"])
    share = (lambda key: sum(c[key] for c in cells) / len(cells)) if cells else (lambda key: None)
    return {"policy": policy_dir, "tasks": tasks, "bundles_per_task": bundles, "bundles": len(rows),
            "parsed": sum(r_["parsed"] for r_ in rows), "criteria": len(cells),
            "distinct_criteria": len({c["text"] for c in cells}),
            "distinct_criteria_per_task_mean": statistics.mean(len(v) for v in by_task.values()) if by_task else 0,
            "share_naming_the_task": share("names_task"), "share_grounded": share("grounded"),
            "share_from_the_pool": share("pool"), "rows": rows}


def groups_figures(paths: list[str], env) -> dict:
    """The bundles written in training in `paths` (groups.jsonl), per criterion: names the task, pool."""
    tasks = {t.id: t for split in ("train", "test") for t in env.tasks(split)}
    pool, cells, by_task, bundles = set(criteria_pool(env.name)), [], {}, 0
    for path in paths:
        for line in Path(path).read_text().splitlines():
            group = json.loads(line)
            task = tasks[group["task"]["id"]]
            for criteria in group["bundles"]:
                bundles += 1
                by_task.setdefault(task.id, set()).update(criteria)
                cells += [{"names_task": names_task(c, task), "pool": c in pool, "text": c} for c in criteria]
    return {"groups_files": paths, "bundles": bundles, "criteria": len(cells),
            "distinct_criteria": len({c["text"] for c in cells}), "tasks": len(by_task),
            "distinct_criteria_per_task_mean": statistics.mean(len(v) for v in by_task.values()),
            "share_naming_the_task": sum(c["names_task"] for c in cells) / len(cells),
            "share_from_the_pool": sum(c["pool"] for c in cells) / len(cells)}


def main(argv=None) -> int:
    global ENV
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/cpu_study.yaml")
    parser.add_argument("--per-task", type=int, default=4, help="demonstrations per training task and kind (>= 1)")
    parser.add_argument("--policy", default="", help="a warm-started policy dir: measure what it writes")
    parser.add_argument("--tasks", type=int, default=8, help="with --policy: held-out tasks (>= 1)")
    parser.add_argument("--bundles", type=int, default=2, help="with --policy: bundles per task (>= 1)")
    parser.add_argument("--groups", nargs="+", default=[], help="groups.jsonl files: measure their bundles")
    parser.add_argument("--out", default="", help="the JSON file to write (default: see above)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.per_task < 1 or args.tasks < 1 or args.bundles < 1:
        parser.error("--per-task, --tasks and --bundles: expected counts >= 1")
    config = load_config(args.config, args.overrides)
    if args.groups:
        result = groups_figures(args.groups, envs.from_config(config.env))
        path = Path(args.out or OUT.parent / "groups.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=1), f"wrote {path}", file=sys.stderr)
        return 0
    if args.policy:
        result = policy_figures(config, args.policy, args.tasks, args.bundles)
        name = Path(args.policy).parts[-3] if len(Path(args.policy).parts) >= 3 else "policy"  # runs/<name>/...
        path = Path(args.out or OUT.parent / f"policy_{name}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": args.config, "overrides": args.overrides, **result}, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1), f"wrote {path}", file=sys.stderr)
        return 0
    w, r, e = config.warm_start, config.rollout, config.env
    ENV = envs.from_config(e)
    tokenizer = load_tokenizer(config.model.path)
    template = config.rubric.generation_template or None
    result = {"config": args.config, "overrides": args.overrides, "group_size": r.group_size,
              "transcript_chars": config.rubric.transcript_chars, "max_actions": e.max_actions, "kinds": {}}
    tasks = ENV.task_pool(e.train_tasks) if e.train_tasks else [ENV.sample_task(random.Random(0)) for _ in range(8)]
    for kind in ("content", "pool"):
        # the warm start's own: its rng after the action demonstrations, as run_warm_start draws them
        rng = random.Random(config.train.seed + 7)
        collect_demos(ENV, tokenizer, w.episodes, r.max_context_tokens - r.max_new_tokens, rng, w.noise,
                      e.max_actions, e.max_history_turns, prompt_templates(e.name, e.prompt))
        chars = config.rubric.transcript_chars
        made = (content_demos(ENV, tokenizer, w.bundle_demos, r.group_size, chars, rng, template, e.max_actions)
                if kind == "content" else
                [pool_demo(ENV, tokenizer, criteria_pool(e.name), r.group_size, chars, rng, template, e.max_actions)
                 for _ in range(w.bundle_demos)])
        own = [(d.task, d.criteria, d.episodes) for d in made]
        rng = random.Random(1)
        per_task = []
        for task in tasks:
            for _ in range(args.per_task):
                if kind == "content":
                    d = content_demo(ENV, tokenizer, task, r.group_size, config.rubric.transcript_chars, rng, template,
                                     e.max_actions)
                else:
                    d = pool_demo(OneTask(ENV, task), tokenizer, criteria_pool(e.name), r.group_size,
                                  config.rubric.transcript_chars, rng, template, e.max_actions)
                per_task.append((task, d.criteria, d.episodes))
        result["kinds"][kind] = {"warm_start_demonstrations": figures(own),
                                 f"training_tasks_x{args.per_task}": figures(per_task),
                                 "example": {"task": own[0][0].description, "answer": own[0][1]}}
        print(kind, json.dumps(result["kinds"][kind], indent=1), file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


ENV = None

if __name__ == "__main__":
    raise SystemExit(main())
