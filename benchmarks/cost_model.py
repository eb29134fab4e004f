"""What a step costs at a given shape, method and device, before renting one (issue 59; docs/scale.md).

Per stage (rollout decode, bundle writing, verifier, plain and rubric replay, reference, update,
weight sync) the FLOPs and bytes moved are counted from the model's shape and the step's token
shape, and turned into seconds from device rates: max(FLOPs / matmul rate, bytes / bandwidth) per
kernel-sized piece (a roofline: no launch or framework overhead, so a lower bound). Decode is one
such piece per generated token and batch: the weights and every sequence's keys/values are read
once per step. The rates are the H200's measured 708 TFLOP/s bf16 matmul and 4.2 TB/s copy
(benchmarks/results/gpu/ceilings.txt, read from there) and an A100 80GB SXM's datasheet figures.

    python benchmarks/cost_model.py                  # the paper's settings: tables on stdout
    python benchmarks/cost_model.py --markdown F     # the same tables as markdown (docs/scale.md)
    python benchmarks/cost_model.py --lora           # the LoRA presets on one GPU beside full training
    python benchmarks/cost_model.py --measure-cpu    # this CPU's fp32 matmul and copy rates (validation)

Every assumption the paper does not fix (reply lengths, prompt sizes, the verifier's size) is a
field of `Setting` with its default stated; docs/scale.md lists them and the model's measured errors
(benchmarks/cost_validation.py checks it against the CPU steps and the H200 op figures).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
GiB = 2**30


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer's shape (Qwen3/Llama: SwiGLU MLP, grouped-query attention)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True

    def linears(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each matmul weight of one layer, under transformers' names: q, k, v, o and
        the MLP's gate, up, down."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def layer_params(self) -> int:
        """Matmul weights of one layer (norms left out)."""
        return sum(d_in * d_out for d_in, d_out in self.linears().values())

    def adapter_params(self, rank: int, layers: int | None = None, targets: tuple[str, ...] = ()) -> int:
        """LoRA (model.lora): A (rank x d_in) and B (d_out x rank) on each target linear of `layers`
        layers (None: all), rank·(d_in + d_out) each; targets () = every linear (target_modules: [])."""
        depth = self.layers if layers is None else layers
        return depth * sum(rank * (d_in + d_out) for name, (d_in, d_out) in self.linears().items()
                           if not targets or name in targets)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.vocab * self.hidden * (1 if self.tied else 2)

    def kv_bytes(self, dtype_bytes: int = 2) -> int:
        """Keys and values of one token, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def forward_flops(self, tokens: float, pairs: float, scored: float, layers: int | None = None,
                      lora_rank: int = 0) -> float:
        """One forward: 2 FLOPs per weight per token (rank-`lora_rank` adapters included, as x·A then
        ·B), 4·head_dim per query-key pair and query head (Q·Kᵀ and P·V, as benchmarks/flops.py
        counts attention), 2·H·V per token whose log-prob (or next token) the LM head computes."""
        depth = self.layers if layers is None else layers
        return (2 * tokens * (depth * self.layer_params + self.adapter_params(lora_rank, depth))
                + 4 * depth * self.heads * self.head_dim * pairs + 2 * scored * self.hidden * self.vocab)


QWEN3_1P7B = Model("Qwen3-1.7B", 28, 2048, 6144, 16, 8, 128, 151_936)
QWEN3_4B = Model("Qwen3-4B", 36, 2560, 9728, 32, 8, 128, 151_936)
#: the verifier assumed for the tables (the paper names none that we could read): a Qwen3-8B judge
QWEN3_8B = Model("Qwen3-8B", 36, 4096, 12288, 32, 8, 128, 151_936, tied=False)
SMOLLM2_135M = Model("SmolLM2-135M", 30, 576, 1536, 9, 3, 64, 49_152)


@dataclass(frozen=True)
class Device:
    name: str
    matmul: float  # FLOP/s of a large bf16 (CPU: fp32) matmul
    bandwidth: float  # bytes/s of memory traffic
    memory: float  # bytes
    link: float = 0.0  # bytes/s one way per GPU for ZeRO's collectives (0: one device)
    source: str = "datasheet"


def h200_measured() -> Device:
    """The H200 of benchmarks/results/gpu/: its measured matmul and copy rates and its memory."""
    gpu = RESULTS / "gpu"
    text = (gpu / "ceilings.txt").read_text()
    tflops = float(re.search(r"([\d.]+) TFLOP/s", text).group(1))
    gbps = float(re.search(r"([\d.]+) GB/s", text).group(1))
    mib = float(re.search(r"NVIDIA H200, [^,]+, (\d+) MiB", (gpu / "environment.txt").read_text()).group(1))
    return Device("H200 (measured rates)", tflops * 1e12, gbps * 1e9, mib * 2**20, source="measured")


#: an A100 80GB SXM's datasheet: 312 TFLOP/s dense bf16, 2,039 GB/s HBM2e, NVLink 600 GB/s (300 one way)
A100_80GB = Device("A100 80GB (datasheet)", 312e12, 2.039e12, 80 * 2**30, link=300e9)
H200_DATASHEET = Device("H200 (datasheet)", 989e12, 4.8e12, 141e9)
#: one modest GPU, the LoRA presets' (datasheets): an RTX 4090 (24 GB GDDR6X, 1,008 GB/s; 165.2 TFLOP/s
#: dense bf16 with f32 accumulation) for Qwen3-1.7B, an L40S (48 GB GDDR6, 864 GB/s; 362 TFLOP/s dense bf16)
#: for Qwen3-4B
RTX_4090 = Device("RTX 4090 24GB (datasheet)", 165.2e12, 1.008e12, 24 * 2**30)
L40S = Device("L40S 48GB (datasheet)", 362e12, 0.864e12, 48 * 2**30)


@dataclass(frozen=True)
class Setting:
    """A step's token shape. A trajectory runs all `turns` (the horizon: the worst case) and its last
    record, context + reply, fills `budget`; the context grows by the same number of tokens each turn
    (an action and an observation). Fields marked 'assumed' are ours, not the paper's."""

    name: str
    turns: int
    budget: int
    tasks: int = 8
    group: int = 8
    bundles: int = 4  # M
    reply_tokens: float = 256  # assumed: half the 512-token cap per action turn
    first_context: float = 1024  # assumed: system prompt, task and first observation
    history_window: int = 0  # turns of history kept (0: all, the paper's)
    bundle_tokens: float = 1024  # assumed: of the 4,096-token cap
    rubric_tokens: float = 200  # assumed: 5-8 criteria as the spliced message renders them
    transcript_tokens: float = 1500  # rubric.transcript_chars = 6,000 at ~4 characters a token
    prompt_extra: float = 500  # instructions around the transcripts (bundle prompt and verifier)
    verifier_answer: float = 256  # assumed: a JSON score per criterion, with a short reasoning
    verifier_concurrency: int = 8  # requests in flight per rank (verifier.concurrency)
    micro_batch_records: int = 1  # optim.micro_batch_size (WebShop 1, ALFWorld 2)
    checkpointing: bool = True  # model.gradient_checkpointing (the paper presets)
    trained_layers: int = 0  # optim.train_layers (0: all); with reuse_frozen, reference and update run only those
    lora_rank: int = 0  # model.lora.rank (0: every parameter trains); adapters on every linear of the trained layers
    token_budget: int = 32768  # replay.token_budget: tokens per no-grad forward
    steps: int = 300
    growth_tokens: float = 0  # context growth per turn (0: what fills `budget` at the last turn)
    update_shares_prefix: bool = False  # the update forwards along the prefix tree (no checkpointing)
    rollout_prefix_cache: bool = True  # vLLM keeps earlier turns' keys/values (the hf engine does not)
    dtype_bytes: int = 2  # bytes per weight and cached key/value (bf16; 4 for an fp32 CPU run)

    @property
    def growth(self) -> float:
        if self.growth_tokens:
            return self.growth_tokens
        return (self.budget - self.reply_tokens - self.first_context) / max(self.turns - 1, 1)

    def contexts(self) -> list[float]:
        """Each turn's context length (every trajectory alike)."""
        window = self.history_window or self.turns
        return [self.first_context + min(t, window) * self.growth for t in range(self.turns)]

    def own_history(self) -> list[float]:
        """Tokens of each record's context that no earlier record of its trajectory holds as a prefix:
        under a full history each context extends the one before by `growth`; past a window it slides
        and the record's whole history is its own."""
        window = self.history_window or self.turns
        return [0.0 if t == 0 else (self.growth if t <= window else window * self.growth) for t in range(self.turns)]


ALFWORLD = Setting("ALFWorld", turns=50, budget=16_384, micro_batch_records=2)
WEBSHOP = Setting("WebShop", turns=15, budget=30_720, micro_batch_records=1)

#: the LoRA presets (configs/*_lora.yaml): model.lora.rank, the one GPU each model's presets are sized
#: for, and their rollout.vllm_gpu_memory_utilization (the paper presets' value)
LORA_RANK = 16
LORA_GPU = {"Qwen3-1.7B": RTX_4090, "Qwen3-4B": L40S}
LORA_VLLM_FRACTION = 0.35


def trainable_params(s: Setting, model: Model) -> int:
    """The parameters AdamW holds: with LoRA the adapters of the trained layers; without, every
    parameter (as the memory estimate counts them, also with optim.train_layers)."""
    return model.adapter_params(s.lora_rank, s.trained_layers or None) if s.lora_rank else model.params


def pairs(tokens: float, start: float) -> float:
    """Query-key pairs of `tokens` new positions after `start` cached ones, causal (flash attention
    skips the masked blocks)."""
    return tokens * start + tokens * (tokens + 1) / 2


def roofline(device: Device, flops: float, bytes_moved: float) -> float:
    return max(flops / device.matmul, bytes_moved / device.bandwidth)


def decode(model: Model, device: Device, batch: float, steps: float, context: float, dtype_bytes: int = 2) -> dict:
    """`steps` decode steps of `batch` sequences whose context averages `context` tokens: each step
    reads the weights once and every sequence's keys/values, and computes one token per sequence."""
    flops = batch * (model.forward_flops(1, context, 1))
    bytes_moved = dtype_bytes * model.params + batch * model.kv_bytes(dtype_bytes) * context
    return {"flops": steps * flops, "bytes": steps * bytes_moved, "seconds": steps * roofline(device, flops, bytes_moved)}


def forward(model: Model, device: Device, tokens: float, attn_pairs: float, scored: float,
            layers: int | None = None, batches: float = 1.0, dtype_bytes: int = 2, lora_rank: int = 0) -> dict:
    """A forward over `tokens`; the weights read once per batch (compute-bound). `lora_rank`: the
    adapted policy (the adapters' FLOPs added; their bytes are small next to the weights')."""
    flops = model.forward_flops(tokens, attn_pairs, scored, layers, lora_rank)
    bytes_moved = batches * dtype_bytes * model.params
    return {"flops": flops, "bytes": bytes_moved, "seconds": roofline(device, flops, bytes_moved)}


def add(*parts: dict) -> dict:
    return {k: sum(p[k] for p in parts) for k in ("flops", "bytes", "seconds")}


def stage_costs(s: Setting, model: Model, device: Device, ranks: int, verifier: Model = QWEN3_8B) -> dict:
    """FLOPs, bytes and seconds per stage of one step on one rank (each rank holds tasks/ranks groups;
    the verifier is one server, on a GPU of its own of the same kind, that every rank calls). With
    LoRA the replay passes and the update run the adapted policy; the rollout and the bundles run in
    vLLM on merged weights and the reference pass on the base, without adapters."""
    groups = s.tasks / ranks
    trajectories = groups * s.group
    contexts, own = s.contexts(), s.own_history()
    r, b = s.reply_tokens, s.dtype_bytes
    out = {}
    # rollout: each turn prefills what is new (vLLM's prefix cache: the action and observation since
    # the last turn; the hf engine: each context again, a prefix its batch shares once), then
    # decodes `reply` tokens per sequence
    turns = []
    for t, c in enumerate(contexts):
        new = s.first_context if t == 0 else (s.growth if s.rollout_prefix_cache else c - s.first_context)
        shared = groups * s.first_context if t == 0 or not s.rollout_prefix_cache else 0.0
        rows = 0.0 if t == 0 else trajectories * new
        turns.append(forward(model, device, shared + rows, groups * pairs(s.first_context, 0) * (shared > 0)
                             + trajectories * pairs(new, c - new) * (rows > 0), 0, dtype_bytes=b))
        turns.append(decode(model, device, trajectories, r, c + r / 2, b))
    out["rollout"] = add(*turns)
    # bundles: per group one prompt of N transcripts, M bundles decoded together (ORSD only)
    prompt = s.prompt_extra + s.group * s.transcript_tokens
    out["bundles"] = add(forward(model, device, groups * prompt, groups * pairs(prompt, 0), 0, dtype_bytes=b),
                         decode(model, device, groups * s.bundles, s.bundle_tokens, prompt + s.bundle_tokens / 2, b))
    out["verifier"] = verifier_cost(s, verifier, device, ranks)
    # plain replay (both methods): along the prefix tree, a group's first context once, each
    # trajectory's history once, each record's reply in its own leaf
    tree = groups * s.first_context + trajectories * (sum(own) + s.turns * r)
    tree_pairs = groups * pairs(s.first_context, 0) + trajectories * sum(
        pairs(o, c - o) + pairs(r, c) for o, c in zip(own, contexts))
    batches = math.ceil(tree / s.token_budget)
    out["plain_replay"] = forward(model, device, tree, tree_pairs, trajectories * s.turns * r, batches=batches,
                                  dtype_bytes=b, lora_rank=s.lora_rank)
    # rubric replay (ORSD only): each record continues from its kept plain sequence at the slot
    # (rubric.placement=action: right before the reply) with the rubric, the 4-token generation
    # prompt and the reply
    spliced = trajectories * s.turns * (s.rubric_tokens + 4 + r)
    out["rubric_replay"] = forward(model, device, spliced, trajectories * sum(pairs(s.rubric_tokens + 4 + r, c)
                                                                          for c in contexts),
                                   trajectories * s.turns * r, batches=math.ceil(spliced / s.token_budget),
                                   dtype_bytes=b, lora_rank=s.lora_rank)
    # reference: the plain pass's tokens (with frozen bottom layers reused, only the trained ones)
    out["reference"] = forward(model, device, tree, tree_pairs, trajectories * s.turns * r,
                               layers=s.trained_layers or None, batches=batches, dtype_bytes=b)
    out["update"] = update_cost(s, model, device, ranks, (tree, tree_pairs) if s.update_shares_prefix else None)
    out["sync"] = sync_cost(s, model, device)
    return out


def sync_cost(s: Setting, model: Model, device: Device) -> dict:
    """The weights pushed to the colocated vLLM: one copy (read + write). With LoRA each adapted
    weight is first merged, W + (alpha/r)·B·A (engines/weight_sync.named_tensors): B·A computed
    (2·r FLOPs a weight) and written, then it and W read and their sum written."""
    b = s.dtype_bytes
    copy = {"flops": 0.0, "bytes": 2.0 * b * model.params, "seconds": 2.0 * b * model.params / device.bandwidth}
    if not s.lora_rank:
        return copy
    adapted = (s.trained_layers or model.layers) * model.layer_params
    flops, moved = 2.0 * s.lora_rank * adapted, 4.0 * b * adapted
    return add(copy, {"flops": flops, "bytes": moved, "seconds": roofline(device, flops, moved)})


def train_flops(model: Model, tokens: float, attn_pairs: float, scored: float, checkpointing: bool,
                fused_head: bool = True, layers: int | None = None, lora_rank: int = 0) -> float:
    """Forward + backward: the decoder's matmuls 3x the forward (dX and dW), 4x with checkpointing's
    recompute; attention's backward 2.5x its forward (flash: Q·Kᵀ again, dV, dP, dQ, dK); the LM head
    3 GEMMs a scored token, 4 in the fused op (it recomputes the logits in its backward). With LoRA
    (`lora_rank` > 0) the base weights and the head are frozen, so their dW is not computed (the
    decoder 2x, 3x with recompute; the head one GEMM less), and the adapters train as weights do."""
    depth = model.layers if layers is None else layers
    passes = 4.0 if checkpointing else 3.0
    frozen = 1.0 if lora_rank else 0.0
    linear = (passes - frozen) * 2 * tokens * depth * model.layer_params
    adapters = passes * 2 * tokens * model.adapter_params(lora_rank, depth)
    attention = (4.5 if checkpointing else 3.5) * 4 * depth * model.heads * model.head_dim * attn_pairs
    head = ((8.0 if fused_head else 6.0) - 2 * frozen) * scored * model.hidden * model.vocab
    return linear + adapters + attention + head


def update_cost(s: Setting, model: Model, device: Device, ranks: int, tree: tuple | None = None) -> dict:
    """Whole records (gradient checkpointing leaves no keys/values to share a prefix through),
    micro-batches of `micro_batch_records` padded to the longest; decoder forward + backward (2x) +
    recompute (1x with checkpointing), attention backward 2.5x its forward (flash); the fused LM head
    4 GEMMs a scored token (logits, their recompute, dH, dW); AdamW over this rank's ZeRO-2 shard
    (~30 bytes a parameter: f32 master, gradient and moments read, written back, bf16 copy); the
    gradients' reduce-scatter and the weights' all-gather over the links. `tree`: (tokens, pairs) of
    the prefix tree, where the update forwards along it instead (optim.share_prefix, no checkpointing).
    With LoRA the optimizer and the collectives cover the adapters only."""
    trajectories = s.tasks / ranks * s.group
    lengths = [c + s.reply_tokens for c in s.contexts()]
    k = s.micro_batch_records
    padded = [max(lengths[i:i + k]) for i in range(0, len(lengths), k) for _ in lengths[i:i + k]]
    layers = s.trained_layers or model.layers
    tokens = trajectories * sum(padded)
    attn = trajectories * sum(pairs(n, 0) for n in padded)
    if tree is not None:
        tokens, attn = tree
    scored = trajectories * s.turns * s.reply_tokens
    flops = train_flops(model, tokens, attn, scored, s.checkpointing, layers=layers, lora_rank=s.lora_rank)
    trained = trainable_params(s, model)
    optimizer = 30.0 * trained / ranks * (1.0 if s.lora_rank else layers / model.layers)
    comm = 2 * (ranks - 1) / ranks * 2 * 2.0 * trained if ranks > 1 else 0.0
    seconds = flops / device.matmul + optimizer / device.bandwidth + (comm / device.link if comm else 0.0)
    return {"flops": flops, "bytes": optimizer + comm, "seconds": seconds}


def verifier_cost(s: Setting, verifier: Model, device: Device, ranks: int) -> dict:
    """verifier.granularity=per_trajectory: one request per trajectory and bundle, each prefilled
    alone; answers decoded `concurrency` x ranks at a time."""
    requests = s.tasks * s.group * s.bundles
    prompt = s.prompt_extra + s.rubric_tokens + s.transcript_tokens
    flight = min(requests, s.verifier_concurrency * ranks)
    waves = math.ceil(requests / flight)
    prefill = forward(verifier, device, requests * prompt, requests * pairs(prompt, 0), 0, batches=waves)
    answers = decode(verifier, device, flight, waves * s.verifier_answer, prompt + s.verifier_answer / 2)
    return {**add(prefill, answers), "requests": requests, "prompt_tokens": requests * prompt,
            "answer_tokens": requests * s.verifier_answer}


GRPO_STAGES = ("rollout", "plain_replay", "reference", "update", "sync")
ORSD_STAGES = GRPO_STAGES + ("bundles", "verifier", "rubric_replay")


def step_seconds(costs: dict, method: str, verifier: bool = True) -> float:
    stages = ORSD_STAGES if method == "orsd" else GRPO_STAGES
    return sum(costs[k]["seconds"] for k in stages if verifier or k != "verifier")


def memory(s: Setting, model: Model, device: Device, ranks: int, vllm_fraction: float) -> dict:
    """Peak bytes per GPU under ZeRO-2 with vLLM colocated at `vllm_fraction` of the GPU (its weights
    and KV cache inside). Training process: bf16 weights and full bf16 gradients (DeepSpeed's buckets
    hold them until the boundary's reduce), f32 master + moments + gradient shards, the frozen bf16
    reference, and the update's largest micro-batch: each layer's input kept (checkpointing) plus one
    layer's recompute, at the per-token size measured for Qwen3-1.7B's shape on the H200
    (benchmarks/results/update_memory_cuda.json) scaled by hidden + intermediate, plus the fused LM
    head's bf16 weight copy and its gradient. With LoRA the same rules apply to the trainable
    parameters, the adapters (bf16 beside the base weights; their gradients, master and moments: an
    upper bound for one process without DeepSpeed, whose AdamW keeps two bf16 moments and no master),
    the reference is the base itself (no copy) and the frozen head has no gradient; activations as
    before."""
    measured = json.loads((RESULTS / "update_memory_cuda.json").read_text())
    per_token_layer = (measured["micro_batch_extra_mib"]["decoder"] * 2**20
                       - 2 * measured["tokens"] * QWEN3_1P7B.hidden * 2) / measured["tokens"]
    scale = (model.hidden + model.intermediate) / (QWEN3_1P7B.hidden + QWEN3_1P7B.intermediate)
    tokens = s.micro_batch_records * s.budget
    depth = s.trained_layers or model.layers
    activations = (depth * tokens * model.hidden * 2 + per_token_layer * scale * tokens if s.checkpointing
                   else depth * per_token_layer * scale * tokens)
    trained, lora = trainable_params(s, model), s.lora_rank > 0
    parts = {"vllm": vllm_fraction * device.memory,
             "weights_bf16": 2.0 * (model.params + model.adapter_params(s.lora_rank, s.trained_layers or None)),
             "gradients_bf16": 2.0 * trained, "master_moments_grad_f32_shard": 16.0 * trained / ranks,
             "reference_bf16": 0.0 if lora else 2.0 * model.params, "update_activations": activations,
             "lm_head_copy_and_gradient": (2.0 if lora else 4.0) * model.vocab * model.hidden}
    total = sum(parts.values())
    return {"parts": parts, "total": total, "fits": total <= device.memory, "capacity": device.memory}


def row(s: Setting, model: Model, device: Device, ranks: int, fractions: tuple) -> dict:
    """One setting x model on `ranks` x `device`: seconds per stage and step, the run's hours, and the
    memory per GPU at each vLLM fraction."""
    costs = stage_costs(s, model, device, ranks)
    grpo, orsd = step_seconds(costs, "grpo"), step_seconds(costs, "orsd")
    return {"setting": s.name, "model": model.name, "device": device.name, "ranks": ranks,
            "trainable_params": trainable_params(s, model), "stages": costs, "grpo_step": grpo, "orsd_step": orsd,
            "orsd_step_without_verifier": step_seconds(costs, "orsd", verifier=False),
            "grpo_run_hours": grpo * s.steps / 3600, "orsd_run_hours": orsd * s.steps / 3600,
            "memory": {f: memory(s, model, device, ranks, f) for f in fractions}}


def plan(settings=(ALFWORLD, WEBSHOP), models=(QWEN3_1P7B, QWEN3_4B), fractions=(0.50, 0.72)) -> list[dict]:
    """Every setting x model on 4 x A100 80GB (datasheet) and 1 x H200 (measured rates)."""
    return [row(s, model, device, ranks, fractions) for s in settings for model in models
            for device, ranks in ((A100_80GB, 4), (h200_measured(), 1))]


def lora_plan(settings=(ALFWORLD, WEBSHOP), models=(QWEN3_1P7B, QWEN3_4B)) -> list[dict]:
    """Each paper setting x model three times: trained in full on 4 x A100 80GB with vLLM at 0.50 (the
    paper's lower fraction, as in plan()), then on the one GPU that LORA_GPU names for its LoRA preset,
    a single process with vLLM at LORA_VLLM_FRACTION: in full, and with rank-LORA_RANK adapters."""
    rows = []
    for s in settings:
        for model in models:
            gpu, f = LORA_GPU[model.name], LORA_VLLM_FRACTION
            rows += [{**row(s, model, A100_80GB, 4, (0.50,)), "training": "full", "vllm_fraction": 0.50},
                     {**row(s, model, gpu, 1, (f,)), "training": "full", "vllm_fraction": f},
                     {**row(replace(s, lora_rank=LORA_RANK), model, gpu, 1, (f,)), "training": f"LoRA r={LORA_RANK}",
                      "vllm_fraction": f}]
    return rows


def markdown(rows: list[dict]) -> str:
    stages = ("rollout", "bundles", "verifier", "plain_replay", "rubric_replay", "reference", "update", "sync")
    head = "| setting | model | devices | " + " | ".join(stages) + " | GRPO step | ORSD step | ORSD/GRPO (no verifier) | 300 steps GRPO / ORSD |"
    lines = [head, "|" + "---|" * (3 + len(stages) + 4)]
    for r in rows:
        cells = [f"{r['stages'][k]['seconds']:,.1f}" for k in stages]
        lines.append(f"| {r['setting']} | {r['model']} | {r['ranks']} x {r['device']} | " + " | ".join(cells)
                     + f" | {r['grpo_step']:,.0f} s | {r['orsd_step']:,.0f} s | {r['orsd_step'] / r['grpo_step']:.2f}"
                     f" ({r['orsd_step_without_verifier'] / r['grpo_step']:.2f}) | {r['grpo_run_hours']:.1f} / "
                     f"{r['orsd_run_hours']:.1f} h |")
    lines += ["", "| setting | model | devices | weights+grads+ref | optimizer shard | activations | vLLM 0.50 | total at 0.50 | vLLM 0.72 | total at 0.72 | capacity |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["memory"][0.50], r["memory"][0.72]
        p = lo["parts"]
        fixed = p["weights_bf16"] + p["gradients_bf16"] + p["reference_bf16"] + p["lm_head_copy_and_gradient"]
        verdict = lambda m: f"{m['total'] / GiB:,.1f} GiB {'fits' if m['fits'] else '**does not fit**'}"  # noqa: E731
        lines.append(f"| {r['setting']} | {r['model']} | {r['ranks']} x {r['device']} | {fixed / GiB:.1f} | "
                     f"{p['master_moments_grad_f32_shard'] / GiB:.1f} | {p['update_activations'] / GiB:.1f} | "
                     f"{p['vllm'] / GiB:.1f} | {verdict(lo)} | {hi['parts']['vllm'] / GiB:.1f} | {verdict(hi)} | "
                     f"{lo['capacity'] / GiB:.0f} GiB |")
    lines += ["", "| setting | verifier requests / step | prompt tokens / step | answer tokens / step |", "|---|---|---|---|"]
    for r in rows[::4]:
        v = r["stages"]["verifier"]
        lines.append(f"| {r['setting']} | {v['requests']:,} | {v['prompt_tokens']:,.0f} | {v['answer_tokens']:,.0f} |")
    return "\n".join(lines) + "\n"


def lora_markdown(rows: list[dict]) -> str:
    """lora_plan's rows: memory per GPU (GiB) by part, and seconds per step."""
    lines = ["| setting | model | training | GPUs | trainable params | weights + head | gradients + optimizer | "
             "reference | activations | vLLM | total per GPU | update | GRPO step | ORSD step | 300 steps GRPO / ORSD |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in rows:
        m = r["memory"][r["vllm_fraction"]]
        p = m["parts"]
        gib = lambda *keys: f"{sum(p[k] for k in keys) / GiB:,.1f}"  # noqa: E731
        lines.append(f"| {r['setting']} | {r['model']} | {r['training']} | {r['ranks']} x {r['device']} | "
                     f"{r['trainable_params'] / 1e6:,.1f} M | {gib('weights_bf16', 'lm_head_copy_and_gradient')} | "
                     f"{gib('gradients_bf16', 'master_moments_grad_f32_shard')} | {gib('reference_bf16')} | "
                     f"{gib('update_activations')} | {gib('vllm')} ({r['vllm_fraction']:.2f}) | "
                     f"{m['total'] / GiB:,.1f} of {m['capacity'] / GiB:.0f} GiB{'' if m['fits'] else ' **does not fit**'} | "
                     f"{r['stages']['update']['seconds']:,.1f} s | {r['grpo_step']:,.0f} s | {r['orsd_step']:,.0f} s | "
                     f"{r['grpo_run_hours']:.1f} / {r['orsd_run_hours']:.1f} h |")
    return "\n".join(lines) + "\n"


def measure_cpu() -> dict:
    """This CPU's fp32 matmul rate (1024^3, torch's threads) and copy bandwidth (256 MiB), best of 20:
    the best, since other processes on a shared machine only ever slow a trial down."""
    import os
    import time

    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    src = torch.empty(64 * 2**20)
    dst = torch.empty_like(src)

    def best(fn):
        fn()
        times = []
        for _ in range(20):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    return {"matmul_flops_per_second": 2 * 1024**3 / best(lambda: a @ b),
            "copy_bytes_per_second": 2 * src.numel() * 4 / best(lambda: dst.copy_(src)),
            "threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="also write the tables as markdown to this file")
    parser.add_argument("--measure-cpu", action="store_true", help="print this CPU's measured rates and stop")
    parser.add_argument("--lora", action="store_true", help="the LoRA presets beside full training instead, also "
                        "written to benchmarks/results/cost_model_lora.json")
    args = parser.parse_args(argv)
    if args.measure_cpu:
        print(json.dumps(measure_cpu(), indent=2))
        return
    if not args.lora:
        text = markdown(plan())
    else:
        rows = lora_plan()
        text = lora_markdown(rows)
        (RESULTS / "cost_model_lora.json").write_text(json.dumps(
            {"command": "python benchmarks/cost_model.py --lora", "lora_rank": LORA_RANK,
             "lora_vllm_fraction": LORA_VLLM_FRACTION, "full_devices": A100_80GB.__dict__,
             "lora_gpu": {name: device.__dict__ for name, device in LORA_GPU.items()},
             "settings": {s.name: s.__dict__ for s in (ALFWORLD, WEBSHOP)}, "rows": rows}, indent=2) + "\n")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
