"""benchmarks/cost_model.py against what was measured: the H200's op figures and the CPU default step.

    python benchmarks/cost_validation.py [--cpu-rates FILE | --measure]   # prints the tables, writes
                                                                 # benchmarks/results/cost_validation.json

GPU (benchmarks/results/gpu/, one H200): each op's roofline time at the measured matmul and copy
rates against its measured median; one update micro-batch at the paper's WebShop shape (Qwen3-1.7B's
shape cut to 2 layers, 30,720 tokens, checkpointed; benchmarks/results/update_memory_cuda.json).

CPU (the embedded default step: SmolLM2-135M, 2 tasks x 3 rollouts, fp32; 30 records, 492 reply
and 9,978 context tokens): the model's FLOPs per stage against benchmarks/flops.py's counts and its
seconds against the stage times, both of one run (step_cpu_fp32_flops_20261205.json, an AMD EPYC
with AVX-512-BF16), at that CPU's rates (benchmarks/results/cost_model_cpu_rates.json says where
each figure comes from; --measure takes this CPU's instead, meaningful only on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cost_model import (QWEN3_1P7B, RESULTS, SMOLLM2_135M, Device, Setting, h200_measured, measure_cpu,  # noqa: E402
                        roofline, stage_costs, update_cost)

H, V = 2048, 151_936
#: the embedded default's shape (orsd/train/default.yaml) as cost_model sees it. From the results:
#: 6 trajectories of 5 turns, 492 reply tokens over 30 records, contexts summing to 9,978. The first
#: context (243 tokens: system prompt, task, first observation) is what the documented prefix tree
#: (docs/training.md: 27 records of 9,817 tokens forward 3,732 along it) implies when a group's
#: records share it; one turn of history (max_history_turns 1) is then 112 tokens.
DEFAULT_CPU = Setting("default (CPU)", turns=5, budget=0, tasks=2, group=3, bundles=2, reply_tokens=492 / 30,
                      first_context=243, history_window=1, growth_tokens=112, bundle_tokens=128, rubric_tokens=132,
                      transcript_tokens=175, prompt_extra=500, micro_batch_records=1, checkpointing=False,
                      trained_layers=15, token_budget=4096, update_shares_prefix=True, rollout_prefix_cache=False,
                      dtype_bytes=4)


def gpu_ops() -> list[dict]:
    """Roofline predictions of the H200's measured ops (medians from the committed JSON files)."""
    device = h200_measured()
    medians = {}
    for name in ("lm_head_gpu.json", "gpu_benchmarks.json"):
        for bench in json.loads((RESULTS / "gpu" / name).read_text())["benchmarks"]:
            medians[bench["name"]] = bench["stats"]["median"]
    cases = []
    for t in (2048, 16384, 32768):  # forward + backward: 4 GEMMs of 2·T·H·V; f32 logits blocks out and back, twice
        cases.append((f"lm_head_logprobs fwd+bwd T={t:,}", f"test_lm_head_logprobs_cuda[{t}-2048-orsd]",
                      8.0 * t * H * V, 16.0 * t * V))
    for t, key, size in ((4096, "4096-dtype0", 2), (32768, "32768-dtype3", 2), (32768, "32768-dtype6", 4)):
        cases.append((f"token_logprobs T={t:,} {'bf16' if size == 2 else 'f32'}", f"test_token_logprobs_cuda[{key}-orsd-None]",
                      0.0, float(t) * V * size))  # reads the logits once
    for t, key in ((4096, "4096-dtype0"), (32768, "32768-dtype2")):
        cases.append((f"fused_token_logprobs T={t:,} bf16", f"test_fused_token_logprobs_cuda[{key}-orsd]",
                      2.0 * t * H * V, 2.0 * H * V))
    rows = [{"case": label, "measured_s": medians[key], "predicted_s": roofline(device, flops, moved)}
            for label, key, flops, moved in cases]
    # one update micro-batch at the paper's WebShop shape: 2 layers, checkpointed, as cost_model's update
    memory = json.loads((RESULTS / "update_memory_cuda.json").read_text())
    two = replace(QWEN3_1P7B, layers=2)
    one = Setting("update micro-batch", turns=1, budget=memory["tokens"], tasks=1, group=1,
                  reply_tokens=memory["response_tokens"], first_context=memory["tokens"] - memory["response_tokens"])
    decoder = update_cost(replace(one, reply_tokens=0, first_context=memory["tokens"]), two, device, 1)
    head = 8.0 * memory["response_tokens"] * H * V / device.matmul
    rows.append({"case": "update micro-batch, 2 layers, 30,720 tokens: decoder fwd+recompute+bwd",
                 "measured_s": memory["seconds"]["decoder"], "predicted_s": decoder["seconds"]})
    rows.append({"case": "the same with the fused LM head over 29,696 tokens",
                 "measured_s": memory["seconds"]["fused"], "predicted_s": decoder["seconds"] + head})
    for row in rows:
        row["error"] = row["predicted_s"] / row["measured_s"] - 1
    return rows


def cpu_step(rates: dict) -> dict:
    """FLOPs and seconds per stage of the CPU default step: the model against the counter and the clock."""
    counted_file = json.loads((RESULTS / "step_cpu_fp32_flops_20261205.json").read_text())
    timed_file = counted_file  # the same run: its stage seconds
    device = Device("this CPU (measured)", rates["matmul_flops_per_second"], rates["copy_bytes_per_second"], 24 * 2**30)
    costs = stage_costs(DEFAULT_CPU, SMOLLM2_135M, device, 1)
    counted = counted_file["flops"]["counted"]
    flops = {"rollout": (costs["rollout"]["flops"], counted_file["flops"]["rollout"]),
             "plain pass": (costs["plain_replay"]["flops"], counted["grpo"]["plain pass"]),
             "rubric pass": (costs["rubric_replay"]["flops"], counted["orsd"]["replay"] - counted["orsd"]["plain pass"]),
             "bundles": (costs["bundles"]["flops"], counted["orsd"]["bundles"]),
             "reference": (costs["reference"]["flops"], counted["grpo"]["reference"]),
             "update": (costs["update"]["flops"], counted["grpo"]["update"])}
    grpo, orsd = timed_file["grpo_seconds"], timed_file["orsd_seconds"]
    # measured seconds per stage (each method's mean); with replay.overlap the ORSD step writes its
    # bundles beside the plain pass, so its "bundles" is that window and its "replay" the rubric pass
    seconds = {"rollout": (costs["rollout"]["seconds"], timed_file["rollout_seconds"]),
               "plain pass": (costs["plain_replay"]["seconds"], grpo["replay"]),
               "rubric pass": (costs["rubric_replay"]["seconds"], orsd["replay"]),
               "bundles (+ plain pass beside)": (costs["bundles"]["seconds"] + costs["plain_replay"]["seconds"],
                                                 orsd["bundles"]),
               "reference": (costs["reference"]["seconds"], grpo["reference"]),
               "update": (costs["update"]["seconds"], grpo["update"])}
    at_counted = {k: counted_flops / device.matmul for k, (_, counted_flops) in flops.items()}
    return {"rates": rates, "setting": DEFAULT_CPU.__dict__,
            "flops": {k: {"predicted": p, "counted": c, "error": p / c - 1} for k, (p, c) in flops.items()},
            "seconds": {k: {"predicted": p, "measured": m, "error": p / m - 1} for k, (p, m) in seconds.items()},
            "counted_flops_at_measured_rate_s": at_counted,
            "timed_and_counted_file": "step_cpu_fp32_flops_20261205.json"}


def report(gpu: list[dict], cpu: dict) -> str:
    lines = ["| H200 op (measured rates) | measured ms | predicted ms | error |", "|---|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['measured_s'] * 1e3:,.2f} | {r['predicted_s'] * 1e3:,.2f} | {r['error']:+.0%} |" for r in gpu]
    rate = cpu["rates"]
    lines += ["", f"CPU default step (SmolLM2-135M, fp32) at {rate['matmul_flops_per_second'] / 1e9:.0f} GFLOP/s "
              f"fp32 matmul and {rate['copy_bytes_per_second'] / 1e9:.1f} GB/s copy ({rate['threads']} threads)", "",
              "| stage | GFLOP predicted | GFLOP counted | error | s predicted | s measured | error |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for k, f in cpu["flops"].items():
        s = cpu["seconds"]["bundles (+ plain pass beside)" if k == "bundles" else k]
        lines.append(f"| {k}{' (+ plain pass beside, for s)' if k == 'bundles' else ''} | {f['predicted'] / 1e9:,.0f} | "
                     f"{f['counted'] / 1e9:,.0f} | {f['error']:+.0%} | {s['predicted']:.2f} | {s['measured']:.2f} | "
                     f"{s['error']:+.0%} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-rates", default=str(RESULTS / "cost_model_cpu_rates.json"),
                        help="the CPU's rates, as cost_model.measure_cpu() writes them (default: %(default)s)")
    parser.add_argument("--measure", action="store_true", help="measure this CPU's rates instead")
    args = parser.parse_args(argv)
    rates = measure_cpu() if args.measure else json.loads(Path(args.cpu_rates).read_text())
    result = {"gpu_ops": gpu_ops(), "cpu_default_step": cpu_step(rates)}
    (RESULTS / "cost_validation.json").write_text(json.dumps(result, indent=2) + "\n")
    print(report(result["gpu_ops"], result["cpu_default_step"]))
    return result


if __name__ == "__main__":
    main()
