"""Peak memory of one update micro-batch at the paper's shape, by component, with the update's two
LM-head paths (optim.lm_head = chunked, the torch reference, then fused, the native op).

The model is Qwen3-1.7B's shape (hidden 2,048, 16 query / 8 key-value heads of 128, MLP 6,144,
vocabulary 151,936, tied embeddings) cut to 2 decoder layers, random weights, f32 master weights
as orsd trains on a CPU, under the run's autocast (bf16 where the CPU has it natively). One
micro-batch is one turn record (the paper's WebShop unit): a context and a response of `--tokens`
in all, every response token scored, as orsd.train.loss.update feeds it (train_logprobs, then
backward of a token-weighted sum).

    python benchmarks/update_memory.py [--tokens 4096] [--response 3584] [--device cpu]
    writes benchmarks/results/update_memory_<device>.json and .md

Components: the weights, the gradients and AdamW's two moments are sizes (f32), the same for both
paths. What the micro-batch adds is measured: the rise of the peak (CPU: peak RSS, VmHWM reset
through /proc/self/clear_refs after malloc_trim; CUDA: max_memory_allocated) over what was live
before it, once for the decoder alone (its hidden states summed and backpropagated, no head) and
once per LM-head path; the head's share is the path's figure minus the decoder's. Each
measurement runs in its own process, so no path inherits another's heap.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
QWEN3_1P7B = dict(vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960, rope_theta=1_000_000.0,
                  tie_word_embeddings=True, rms_norm_eps=1e-6)
MiB = 2**20


def _peak_extra(fn, device) -> tuple[float, float]:
    """(MiB allocated at the peak beyond what was live before fn(), seconds fn() took): the op
    benchmarks' measure (benchmarks/conftest.py), with fn() timed inside it."""
    import torch
    from conftest import peak_extra_bytes

    seconds = []

    def timed():
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)

    return peak_extra_bytes(timed, device) / MiB, seconds[0]


def measure(what: str, tokens: int, response: int, device_name: str, layers: int) -> dict:
    """In this process: build the model, run one untimed warm-up micro-batch, then measure one."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from orsd.train.model import autocast_dtype
    from orsd.train.precision import resolve_autocast
    from orsd.train.forward import _hidden_rows, train_logprobs

    device = torch.device(device_name)
    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3_1P7B, num_hidden_layers=layers)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen3ForCausalLM(config).train()
    model.gradient_checkpointing_enable()  # the paper presets' setting
    precision = resolve_autocast(model, "auto").autocast
    ids = torch.randint(0, config.vocab_size, (tokens,))
    cu = torch.tensor([0, tokens])
    positions = [torch.arange(tokens - response, tokens)]
    weights = torch.linspace(0.5, 1.5, response, device=device)

    def step():
        model.zero_grad(set_to_none=False)  # gradients stay allocated, as across micro-batches
        if what == "decoder":
            with torch.autocast(device.type, dtype=autocast_dtype(model, precision), enabled=bool(precision)):
                hidden = _hidden_rows(model, ids, cu, [0], positions)
            (hidden.float().sum(-1) * weights).sum().backward()
        else:
            lp, _, _ = train_logprobs(model, ids, cu, [0], positions, 1.0, precision=precision, lm_head=what)
            (lp * weights).sum().backward()

    step()  # warm-up: gradients allocated, kernels chosen, pages touched
    extra_mib, seconds = _peak_extra(step, device)
    return {"what": what, "extra_mib": extra_mib, "seconds": seconds, "precision": precision or "float32",
            "threads": torch.get_num_threads()}


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens in the record (context + response)")
    parser.add_argument("--response", type=int, default=3584, help="response tokens scored")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child mode: decoder | chunked | fused
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(measure(args.one, args.tokens, args.response, args.device, args.layers)))
        return {}
    rows = []
    for what in ("decoder", "chunked", "fused"):
        out = subprocess.run([sys.executable, __file__, "--one", what, "--tokens", str(args.tokens), "--response",
                              str(args.response), "--layers", str(args.layers), "--device", args.device],
                             capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.split("RESULT ", 1)[1]))
        print(rows[-1], flush=True)
    c = QWEN3_1P7B
    vocab, hidden = c["vocab_size"], c["hidden_size"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    q = c["num_attention_heads"] * c["head_dim"]
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * c["intermediate_size"] + 2 * hidden + 2 * c["head_dim"]
    parameters = vocab * hidden + args.layers * per_layer + hidden
    decoder, chunked, fused = rows
    result = {
        "device": args.device, "model": f"Qwen3-1.7B shape, {args.layers} layers, random weights",
        "tokens": args.tokens, "response_tokens": args.response, "precision": fused["precision"],
        "threads": fused["threads"], "load_average_1min": os.getloadavg()[0],
        "fixed_mib": {"weights_f32": parameters * 4 / MiB, "gradients_f32": parameters * 4 / MiB,
                      "adamw_moments_f32": 2 * parameters * 4 / MiB},
        "micro_batch_extra_mib": {r["what"]: r["extra_mib"] for r in rows},
        "lm_head_extra_mib": {"chunked": chunked["extra_mib"] - decoder["extra_mib"],
                              "fused": fused["extra_mib"] - decoder["extra_mib"]},
        "seconds": {r["what"]: r["seconds"] for r in rows},
        "one_response_x_vocab_f32_mib": args.response * vocab * 4 / MiB,
    }
    # under 16-bit autocast both paths cast the V x H head once (autocast's cache / the op's input)
    result["head_weight_copy_mib"] = vocab * hidden * 2 / MiB if fused["precision"] != "float32" else 0.0
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"update_memory_{args.device}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(table(result) + "\n")
    print(table(result))
    return result


def table(r: dict) -> str:
    f, e, h, s = r["fixed_mib"], r["micro_batch_extra_mib"], r["lm_head_extra_mib"], r["seconds"]
    lines = [f"One update micro-batch: {r['model']}, one record of {r['tokens']:,} tokens "
             f"({r['response_tokens']:,} scored), {r['precision']} autocast, {r['threads']} threads, "
             f"{r['device']}, load {r['load_average_1min']:.1f}",
             "", "| component | chunked (torch) MiB | fused (native) MiB |", "|---|---:|---:|"]
    for name, value in f.items():
        lines.append(f"| {name} | {value:,.0f} | {value:,.0f} |")
    lines.append(f"| decoder activations (checkpointed) | {e['decoder']:,.0f} | {e['decoder']:,.0f} |")
    lines.append(f"| LM head + log-softmax, forward + backward | {h['chunked']:,.0f} | {h['fused']:,.0f} |")
    lines.append(f"| micro-batch peak beyond the fixed | {e['chunked']:,.0f} | {e['fused']:,.0f} |")
    lines.append(f"| micro-batch seconds | {s['chunked']:.1f} | {s['fused']:.1f} |")
    lines.append("")
    copy = r.get("head_weight_copy_mib", 0.0)
    if copy:
        lines.append(f"Both paths hold a {r['precision']} copy of the LM head's weight ({copy:,.0f} MiB) and, in the "
                     f"backward, its {r['precision']} gradient (as much again): autocast's copy in the chunked path, "
                     "the cast before the op in the fused one. That pair is most of the fused path's LM-head "
                     "figure; the op's own scratch is tens of MiB (benchmarks/results/lm_head_cpu.md). The rest of "
                     "the chunked path's figure is its 1,024-token f32 logits chunk and log-softmax buffers.")
    lines.append(f"For scale, one response × vocabulary f32 tensor: {r['one_response_x_vocab_f32_mib']:,.0f} MiB.")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
