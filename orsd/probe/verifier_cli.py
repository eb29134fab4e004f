"""`orsd-verifier-check CHECKPOINT`: can the run's verifier tell satisfied from unsatisfied criteria?

    orsd-verifier-check runs/x/checkpoints/step_50 --config runs/x/config.yaml --tasks 12 --out DIR

scores the shop's oracle criteria on the expert's, deliberately corrupted and the policy's own
episodes of held-out tasks with the verifier the run builds (orsd/probe/verifier_check.py), and
writes DIR/verifier_check.json (the figures of every variant, the tasks, episodes and truths),
DIR/verifier_check.md (the table) and DIR/variants/<name>.json (one variant's figures and scores).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from orsd.train.cli import sleeping_openmp_threads

PROG = "orsd-verifier-check"


def parse_args(argv: list[str] | None):
    from .verifier_check import VARIANTS

    parser = argparse.ArgumentParser(
        prog=PROG, description="Score criteria whose truth is known by rule (the shop's oracle criteria on expert, "
                               "corrupted and the policy's episodes) with the run's verifier; report how well its "
                               "score separates satisfied from unsatisfied cells (AUC).",
        epilog=f"variants: {', '.join(VARIANTS)}; overrides: section.key=value, as orsd-train's")
    parser.add_argument("checkpoint", help="an HF model directory (the policy; the run's verifier is its frozen "
                                           "initial policy where checkpoints/reference sits beside it) or smollm2-135m")
    parser.add_argument("--config", help="the run's config.yaml (env, verifier, rubric.transcript_chars); "
                                         "default: the embedded default")
    parser.add_argument("--tasks", type=int, default=12,
                        help="held-out tasks (default 12; the intervals resample them)")
    parser.add_argument("--split", default="test", help="the shop split the tasks come from (default test)")
    parser.add_argument("--samples", type=int, default=2, help="the policy's rollouts per task (default 2; 0: none)")
    parser.add_argument("--variants", nargs="+", default=["training"], metavar="NAME",
                        help="what is scored (default: training, training's own scoring)")
    parser.add_argument("--out", help="output directory (default verifier_check/<checkpoint's name>)")
    parser.add_argument("--seed", type=int, default=0, help="seed of corruptions, rollouts and intervals")
    parser.add_argument("overrides", nargs="*", help="section.key=value config overrides")
    return parser.parse_intermixed_args(argv)


def check_args(args) -> str | None:
    """The first problem with the arguments, as one line naming the argument and the expected form."""
    from .cli import check_args as probe_check
    from .verifier_check import VARIANTS

    for name, least, why in (("tasks", 2, " (the intervals resample tasks)"), ("samples", 0, "")):
        value = getattr(args, name)
        if value < least:
            return f"--{name}={value}: expected an integer >= {least}{why}"
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        return f"--variants {' '.join(unknown)}: expected names among {', '.join(VARIANTS)}"
    if len(set(args.variants)) != len(args.variants):
        return f"--variants {' '.join(args.variants)}: expected each name once"
    # the checkpoint's checks are the probe's (its other arguments are at their defaults)
    return probe_check(argparse.Namespace(checkpoint=args.checkpoint, tasks=1, wrong_per_state=1, samples=1,
                                          heatmap_states=0))


def say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def rollouts(policy, tokenizer, env, tasks, config, samples: int, seed: int, precision) -> list:
    """The policy's own episodes per task: training's rollout function and sampling."""
    import torch

    from orsd.train.model import autocast
    from orsd.train.rollout import Episodes, rollout

    from .cli import make_engine

    engine = make_engine(policy, tokenizer, config)
    with autocast(policy, precision), torch.no_grad():
        return rollout(engine, tokenizer, env, tasks, Episodes.from_config(config, samples), f"verifier-check{seed}")


def run(args, config, argv: list[str]) -> dict:
    import torch

    from orsd.train.build import build_verifier
    from orsd.train.config import to_dict
    from orsd.train.evaluate import eval_tasks, make_eval_env
    from orsd.train.model import load_policy, load_tokenizer
    from orsd.train.precision import configure_threads, resolve_autocast

    from . import truth
    from .cli import clean, machine, verifier_model
    from .verifier_check import VARIANTS, Cells, check_variant, paired_difference

    started, seconds = time.perf_counter(), {}
    m = config.model
    host = machine()
    configure_threads(m.threads)
    host["threads"] = torch.get_num_threads()
    torch.manual_seed(args.seed)
    policy = load_policy(args.checkpoint, m.dtype, m.device, m.attn_implementation, args.seed).eval()
    tokenizer = load_tokenizer(args.checkpoint)
    precision = resolve_autocast(policy, m.autocast).autocast
    frozen, verifier_source = verifier_model(args.checkpoint, policy, config, precision)
    verifier = build_verifier(config, frozen, tokenizer)
    env = make_eval_env(config, args.split)
    tasks = eval_tasks(env, args.split, args.tasks)
    episodes = [truth.task_episodes(env, task, args.seed) for task in tasks]
    seconds["load"] = time.perf_counter() - started
    if args.samples:
        mark = time.perf_counter()
        groups = rollouts(policy, tokenizer, env, tasks, config, args.samples, args.seed, precision)
        for mine, group in zip(episodes, groups):
            mine += [truth.play(env, group.task, t.actions, f"policy_{n}") for n, t in enumerate(group.trajectories)]
        seconds["rollouts"] = time.perf_counter() - mark
    cells = Cells.build(env, tasks, episodes)
    say(f"{sum(map(len, episodes))} episodes on {len(tasks)} tasks of {args.split}; scoring {len(args.variants)} "
        f"variant(s) with {verifier!r}")
    variants = {}
    for name in args.variants:
        mark = time.perf_counter()
        variants[name] = check_variant(verifier, cells, VARIANTS[name], config.rubric.transcript_chars, args.seed)
        seconds[f"variant {name}"] = time.perf_counter() - mark
        f = variants[name]["figures"]
        say(f"{name}: AUC {num(f['auc'])}, within task and criterion {num(f['auc_within_task_and_criterion'])} "
            f"({seconds[f'variant {name}']:.0f} s)")
    if "training" in variants:  # each variant against training's scoring, paired on the same cells
        for name, v in variants.items():
            v["within_minus_training"] = paired_difference(v["figures"]["auc_within_task_and_criterion"],
                                                           variants["training"]["figures"]
                                                           ["auc_within_task_and_criterion"], len(tasks), args.seed)
    seconds["total"] = time.perf_counter() - started
    result = {
        "checkpoint": args.checkpoint, "command": f"{PROG} " + shlex.join(argv), "split": args.split,
        "arguments": {k: v for k, v in vars(args).items() if k != "overrides"}, "overrides": args.overrides,
        "verifier": repr(verifier), "verifier_model": verifier_source, "precision": precision or "fp32",
        "machine": host, "seconds": seconds,
        "intervals": "95 % percentile bootstrap over tasks (scipy.stats.bootstrap, 2000 resamples): a task's cells "
                     "share its criteria and episodes, so tasks are the units",
        "tasks": [{"id": t.id, "description": t.description,
                   "criteria": [{"kind": c.kind, "text": c.text} for c in crits]}
                  for t, crits in zip(tasks, cells.criteria)],
        "episodes": [{"task": i, "name": e.name, "actions": e.actions, "score": e.score,
                      "truth": [None if v != v else bool(v) for v in row] if row is not None else None}
                     for i, (eps, table) in enumerate(zip(cells.episodes, cells.truth))
                     for e, row in zip(eps, [*table, None])],  # the empty transcript last: no truth
        "variants": {k: {key: v for key, v in fig.items() if not key.endswith("scores")}  # scores: variants/*.json
                     for k, fig in variants.items()},
        "config": to_dict(config),
    }
    out = Path(args.out or Path("verifier_check") / Path(args.checkpoint).name)
    (out / "variants").mkdir(parents=True, exist_ok=True)
    (out / "verifier_check.json").write_text(json.dumps(clean(result), indent=1, ensure_ascii=False) + "\n")
    (out / "verifier_check.md").write_text(markdown(clean(result)))
    for name, figures in variants.items():
        record = {"command": result["command"], "machine": host, "verifier": result["verifier"],
                  "seconds": seconds[f"variant {name}"], **figures}
        (out / "variants" / f"{name}.json").write_text(json.dumps(clean(record), indent=1) + "\n")
    result["out"] = str(out)
    return result


def num(figure: dict) -> str:
    from .report import with_ci

    return with_ci(figure)


def markdown(result: dict) -> str:
    """verifier_check.md: one row per variant (raw scores), then the calibrations and the spread."""
    from .truth import KINDS

    first = next(iter(result["variants"].values()))["figures"]["auc"]
    lines = [f"# Verifier check: {result['verifier']}", "", f"    {result['command']}", "",
             f"{len(result['tasks'])} tasks, {len(result['episodes'])} episodes (the empty ones only calibrate); "
             f"cells: {first['satisfied']} satisfied, {first['unsatisfied']} unsatisfied. CPU: "
             f"{result['machine']['cpu']}, {result['machine']['threads']} thread(s); "
             f"{result['seconds']['total']:.0f} s. "
             f"Intervals: {result['intervals']}.", "",
             "| variant | lost an action | AUC | within task and criterion | " + " | ".join(KINDS)
             + " | mean satisfied | mean unsatisfied |",
             "|---|---|---|---|" + "---|" * len(KINDS) + "---|---|"]
    for name, v in result["variants"].items():
        f = v["figures"]
        lines.append(f"| {name} | {v['transcripts_that_lost_an_action']} of {v['transcripts']} | {num(f['auc'])} | "
                     f"{num(f['auc_within_task_and_criterion'])} | "
                     + " | ".join(short(f["auc_by_kind"][k]) for k in KINDS)
                     + f" | {short(f['mean_satisfied'])} | {short(f['mean_unsatisfied'])} |")
    lines += ["", "Per kind: the AUC over the kind's cells. Calibrated: minus the same criterion's score on the "
              "task's empty transcript (a shift per criterion: the AUC within a task and criterion stays), or minus "
              "the matched content-free criterion's score on the same transcript. Spread: the score's standard "
              "deviation between the episodes of a task and criterion, and between criteria.", "",
              "| variant | within − training's, paired | AUC, empty-calibrated | AUC, content-free-calibrated | "
              "within, content-free-calibrated | sd within a task and criterion | sd between criteria |",
              "|---|---|---|---|---|---|---|"]
    for name, v in result["variants"].items():
        e, c, s = v["figures_calibrated"], v["figures_content_free"], v["figures"]["spread"]
        lines.append(f"| {name} | {num(v.get('within_minus_training'))} | {num(e['auc'])} | {num(c['auc'])} | "
                     f"{num(c['auc_within_task_and_criterion'])} | "
                     f"{short({'value': s['sd_within_task_and_criterion']})} | "
                     f"{short({'value': s['sd_between_criteria']})} |")
    lines += ["", "Variants: " + "; ".join(f"`{n}`: {v['description']}" for n, v in result["variants"].items()) + ".",
              ""]
    return "\n".join(lines)


def short(figure: dict) -> str:
    return "–" if figure.get("value") is None else f"{figure['value']:.2f}"


def main(argv: list[str] | None = None) -> int:
    sleeping_openmp_threads()  # before torch is imported (orsd-train's reason)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    problem = check_args(args)
    if problem is None:
        from .cli import load

        try:
            config = load(args)
        except ValueError as error:  # a config or argument the check cannot use (ConfigError is one)
            problem = " ".join(str(error).splitlines()).replace("the probe's oracle rubric", "the oracle criteria")
    if problem is not None:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    result = run(args, config, argv)
    say(f"wrote {result['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
