"""`orsd-probe CHECKPOINT`: the Δ probe of a policy on held-out shop tasks (see orsd/probe/__init__.py).

    orsd-probe runs/x/checkpoints/step_50 --config runs/x/config.yaml --tasks 12 --out runs/x/probe

writes OUT/probe.json (every figure, the config, the checkpoint, the tasks and every reply's
scores), OUT/probe.md (the tables) and OUT/probe.html (per-token Δ heat maps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from orsd.train.cli import sleeping_openmp_threads


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        prog="orsd-probe", description="Probe what Δ (log π with a rubric − log π without) rewards: expert vs wrong "
                                       "replies at the same states under oracle, misleading, selected and control rubrics.",
        epilog="overrides: section.key=value, as orsd-train's (e.g. model.autocast=)")
    parser.add_argument("checkpoint", help="an HF model directory (runs/x/checkpoints/step_N, a warm-started policy) "
                                           "or smollm2-135m")
    parser.add_argument("--config", help="the run's config.yaml (env, prompt, budgets); default: the embedded default")
    parser.add_argument("--tasks", type=int, default=12, help="held-out tasks probed (default 12)")
    parser.add_argument("--split", default="test", help="the shop split the tasks come from (default test)")
    parser.add_argument("--wrong-per-state", type=int, default=3, help="wrong replies per expert state (default 3)")
    parser.add_argument("--samples", type=int, default=4, help="the policy's rollouts per task (default 4)")
    parser.add_argument("--out", help="output directory (default probe/<checkpoint's name>)")
    parser.add_argument("--seed", type=int, default=0, help="seed of rollouts, wrong replies and intervals")
    parser.add_argument("--heatmap-states", type=int, default=6, help="states drawn in probe.html (default 6)")
    parser.add_argument("overrides", nargs="*", help="section.key=value config overrides")
    return parser.parse_intermixed_args(argv)


def check_args(args) -> str | None:
    """The first problem with the arguments, as one line naming the argument and the expected form."""
    from orsd.train.model import SMOLLM2

    path = args.checkpoint
    if path != SMOLLM2 and not path.startswith("random:") and not (Path(path) / "config.json").is_file():
        why = "not found" if not Path(path).exists() else "holds no config.json"
        return (f"CHECKPOINT={path}: {why}; expected an HF model directory (config.json and weights) such as "
                f"runs/x/checkpoints/step_N, or smollm2-135m")
    for name, least in (("tasks", 1), ("wrong_per_state", 1), ("samples", 1), ("heatmap_states", 0)):
        value = getattr(args, name)
        if value < least:
            return f"--{name.replace('_', '-')}={value}: expected an integer >= {least}"
    return None


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "load_average_before": list(os.getloadavg()), "torch": torch.__version__}


def clean(value):
    """JSON without NaN: NaN and inf become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def verifier_model(checkpoint: str, policy, config, precision: str):
    """The model the run's local verifier used: a LoRA checkpoint's base (model.lora: the base
    without the adapters), the run's frozen initial policy where the checkpoint sits beside it
    (runs/x/checkpoints/reference), else a frozen copy of the probed policy."""
    from orsd.train import lora
    from orsd.train.model import frozen_copy, load_policy

    m = config.model
    if lora.is_adapter_dir(checkpoint):
        base = lora.saved_settings(checkpoint)["base"]
        return frozen_copy(load_policy(base, m.dtype, m.device, m.attn_implementation), precision), base
    reference = Path(checkpoint).parent / "reference"
    if reference.resolve() != Path(checkpoint).resolve() and (reference / "config.json").is_file():
        return frozen_copy(load_policy(str(reference), m.dtype, m.device, m.attn_implementation), precision), str(reference)
    return frozen_copy(policy, precision), checkpoint


def load(args):
    """The config the probe runs with; ValueError (ConfigError is one) for one it cannot use."""
    from orsd import envs
    from orsd.train.config import load_config

    config = load_config(args.config, [*args.overrides, f"model.path={args.checkpoint}"])
    if config.env.name != "webshop":
        raise ValueError(f"env.name={config.env.name!r}: the probe's oracle rubric exists for the shop only; "
                         f"expected env.name=webshop")
    if args.split not in envs.SPLITS["webshop"]:
        raise ValueError(f"--split={args.split}: expected one of {list(envs.SPLITS['webshop'])}")
    return config


def make_engine(policy, tokenizer, config):
    """The rollout and bundle engine, as the trainer builds its `hf` engine (build.build_engine)."""
    from orsd.engines.hf import HfEngine
    from orsd.train.warmstart import draft_corpus

    return HfEngine(policy, tokenizer, config.rollout.batch_size, draft_corpus=draft_corpus(config, tokenizer))


def say(text: str) -> None:
    print(f"orsd-probe: {text}", file=sys.stderr, flush=True)


def run(args, config, argv: list[str]) -> dict:
    """Size: the probe's stages top to bottom (load, expert states, rollouts, bundles, scoring, summary), each
    timed, the values passed from one to the next in its locals."""
    import torch
    from tqdm.auto import tqdm

    from orsd import envs
    from orsd.envs.prompts import prompt_templates
    from orsd.train.build import build_verifier
    from orsd.train.config import to_dict
    from orsd.train.evaluate import eval_tasks, make_eval_env
    from orsd.train.model import autocast, load_policy, load_tokenizer
    from orsd.train.precision import configure_threads, resolve_autocast
    from orsd.train.rollout import Episodes, rollout

    from . import kinds, report, scoring, states as probe_states, stats, summary

    started, seconds = time.perf_counter(), {}
    m, e = config.model, config.env
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
    # the expert played on from any state to completion: a horizon that never cuts it short
    shadow = envs.make(e.name, split=args.split, seed=e.seed, **{**e.options, "max_actions": 100})
    tasks = eval_tasks(env, args.split, args.tasks)
    spare = next(t for t in env.tasks(args.split) if t.id not in {u.id for u in tasks}) if len(tasks) == 1 else None
    templates = prompt_templates(e.name, e.prompt)
    seconds["load"] = time.perf_counter() - started
    with autocast(policy, precision), torch.no_grad():
        mark = time.perf_counter()
        states, replies = probe_states.expert_states(env, shadow, tokenizer, tasks, args.wrong_per_state, config,
                                                     args.seed, templates)
        seconds["expert_states"] = time.perf_counter() - mark
        say(f"{len(states)} expert states on {len(tasks)} tasks of {args.split}, "
            f"{sum(r.role == 'wrong' for r in replies)} wrong replies; the policy's rollouts next")
        mark = time.perf_counter()
        engine = make_engine(policy, tokenizer, config)
        groups = rollout(engine, tokenizer, env, tasks, Episodes.from_config(config, args.samples), f"probe{args.seed}")
        replies += probe_states.policy_replies(groups, shadow)
        seconds["rollouts"] = time.perf_counter() - mark
        say(f"{args.samples} rollouts per task in {seconds['rollouts']:.0f} s; bundles, verifier and selection next")
        mark = time.perf_counter()
        candidates, selection = kinds.select_bundles(config, engine, tokenizer, verifier, groups, args.seed)
        rubrics = kinds.task_rubrics(tasks, candidates, selection, args.seed, spare)
        seconds["bundles"] = time.perf_counter() - mark
        say(f"B* on {sum(t.bundles['selected'] is not None for t in rubrics)} of {len(tasks)} tasks in "
            f"{seconds['bundles']:.0f} s; paired replay under {len(kinds.KINDS)} kinds next")
        mark = time.perf_counter()
        ids = [{k: kinds.rubric_token_ids(tokenizer, t.bundles[k], config) for k in kinds.KINDS} for t in rubrics]
        with tqdm(total=len(tasks), desc="orsd-probe replay", unit="task", disable=not config.train.progress) as bar:
            scores = scoring.score_all(policy, replies, ids, config, progress=bar.update)
        seconds["replay"] = time.perf_counter() - mark
    classes = [stats.token_classes(tokenizer, reply.record.response_ids) for reply in replies]
    figures = summary.summarize(states, replies, scores, classes, args.seed)
    seconds["total"] = time.perf_counter() - started
    result = {
        "checkpoint": args.checkpoint, "command": "orsd-probe " + shlex.join(argv), "split": args.split,
        "arguments": {k: v for k, v in vars(args).items() if k != "overrides"}, "overrides": args.overrides,
        "verifier_model": verifier_source, "precision": precision or "fp32", "machine": host, "seconds": seconds,
        **figures, "config": to_dict(config),
        "tasks": [{"id": t.id, "description": t.description, "kind": t.kind, "rewards": g.rewards, **k.to_dict()}
                  for t, g, k in zip(tasks, groups, rubrics)],
        "states": [{"task": s.task, "turn": s.turn, "page": s.page, "expert": s.expert, "replies": s.replies}
                   for s in states],
        "replies": [{"role": x.role, "task": x.task, "state": x.state, "trajectory": x.trajectory, "page": x.page,
                     "action": x.action, "matches_expert": x.matches_expert, "tokens": len(x.record.response_ids),
                     "lp_plain": float(scores.plain[i].sum()),
                     "lp": {k: (None if scores.kinds[k][i] is None else float(scores.kinds[k][i].sum()))
                            for k in kinds.KINDS}}
                    for i, x in enumerate(replies)],
    }
    out = Path(args.out or Path("probe") / Path(args.checkpoint).name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(clean(result), indent=1, ensure_ascii=False) + "\n")
    (out / "probe.md").write_text(report.markdown(clean(result)))
    tokens = [[tokenizer.decode([i]) for i in reply.record.response_ids] for reply in replies]
    (out / "probe.html").write_text(report.heatmap_page(clean(result), states, replies, scores, tokens,
                                                        args.heatmap_states))
    result["out"] = str(out)
    return result


def main(argv: list[str] | None = None) -> int:
    sleeping_openmp_threads()  # before torch is imported (orsd-train's reason)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    problem = check_args(args)
    if problem is None:
        try:
            config = load(args)
        except ValueError as error:  # a config or argument the probe cannot use (ConfigError is one)
            problem = " ".join(str(error).splitlines())
    if problem is not None:
        print(f"orsd-probe: {problem}", file=sys.stderr)
        return 2
    result = run(args, config, argv)
    p = result["prediction"]
    print(f"orsd-probe: {result['counts']['states']} states, {result['seconds']['total']:.0f} s; paired AUC of Δ: "
          + ", ".join(f"{k} {num(result['scores'][f'Δ {k}']['expert_vs_wrong']['auc'])}"
                      for k in ("oracle", "misleading", "selected"))
          + f"; plain log π {num(result['scores']['plain']['expert_vs_wrong']['auc'])}; "
          f"prediction (a) {'holds' if p['a_oracle_above_half'] else 'fails'}, "
          f"(b) {'holds' if p['b_misleading_not_above_half'] else 'fails'}; wrote {result['out']}")
    return 0


def num(figure: dict) -> str:
    from .report import with_ci

    return with_ci(figure)


if __name__ == "__main__":
    sys.exit(main())
