"""Self-check: run every op on small, awkward inputs on one device and compare it with the torch
reference (orsd/ops/reference.py) on the same device, within the tolerances docs/ops.md states.

Meant for the start of a run and for bug reports (`orsd-doctor`): a kernel miscompiled for this
GPU, a driver that runs our static CUDA runtime wrongly, or a CPU instruction set that computes
differently shows up here in a second instead of as a slowly wrong training curve. The inputs
cover the shapes that hit kernel edge paths: a vocabulary of 1, rows that cross the 4096-element
block and the vector tails, masked rows, -inf/NaN/large logits, f16/bf16/f32, chunk sizes that do
not divide V, H = 0, singleton/constant/sparse groups, empty sequences, slots at both ends,
non-finite deltas and empty micro-batches. lm_head_logprobs is checked with its gradients: the
check runs its forward and backward and compares lp, entropy, grad_hidden and grad_weight with
torch autograd through f64 logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import torch

from . import _backend, reference

#: every op of orsd.ops: the six reference.py specifies, then lm_head_logprobs, whose reference is
#: torch autograd through f64 logits (_lm_head_reference below)
OPS = (*reference.__all__, "lm_head_logprobs")


class SelfCheckError(RuntimeError):
    """An op disagreed with the reference (or failed) in self_check(..., strict=True); `results`
    holds the full report."""

    def __init__(self, device: torch.device, results: dict[str, dict]):
        self.device = device
        self.results = results
        failed = [f"{op}: {r['detail']}" for op, r in results.items() if not r["ok"]]
        super().__init__(f"orsd op self-check failed on {device}:\n  " + "\n  ".join(failed))


def self_check(
    device: str | torch.device = "cpu",
    ops: Iterable[str] | Mapping[str, Callable] | None = None,
    *,
    strict: bool = False,
) -> dict[str, dict]:
    """Run the ops on `device` and compare each with the reference on the same device.

    ops: None for all seven; names for a subset; or a mapping name -> callable to check another
    implementation under an op's name (the callable takes the op's arguments). Returns
    {op: {"ok": bool, "max_error": float, "detail": str}}: max_error is the largest absolute
    difference over all cases (inf for a NaN/inf pattern mismatch or an exception), detail says
    which implementation ran and the worst case, or what went wrong. With strict=True a failure
    raises SelfCheckError instead of returning.
    """
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device} is not available (torch.cuda.is_available() is False)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: {device} is not supported; expected cpu or cuda")
    functions = _resolve(ops)
    kind = _backend.native_kind(device)
    runs = "native kernels" if kind else "torch reference (no native kernel here: compared with itself)"
    results = {}
    for name, function in functions.items():
        results[name] = _check_one(name, function, device, runs)
    if strict and not all(r["ok"] for r in results.values()):
        raise SelfCheckError(device, results)
    return results


def _resolve(ops) -> dict[str, Callable]:
    import orsd.ops

    if ops is None:
        return {name: getattr(orsd.ops, name) for name in OPS}
    if isinstance(ops, str):  # one name, not its letters
        ops = [ops]
    if isinstance(ops, Mapping):
        functions = dict(ops)
    else:
        functions = {name: getattr(orsd.ops, name, None) for name in ops}
    unknown = [name for name in functions if name not in OPS]
    if unknown:
        raise ValueError(f"ops: unknown op(s) {unknown}; expected names from {list(OPS)}")
    return functions


def _check_one(name: str, function: Callable, device: torch.device, runs: str) -> dict:
    generator = torch.Generator().manual_seed(1234)
    worst_error, worst_case, worst_tolerance = 0.0, "", 0.0
    cases = list(_CASES[name](generator))
    label = "(before the first case)"
    try:
        for label, args, tolerance in cases:
            args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
            got = _lm_head_with_gradients(function, args) if name == "lm_head_logprobs" else function(**args)
            want = _expected(name, args)
            error, problem = _difference(got, want, tolerance)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # an asynchronous kernel error belongs to this case
            if problem:
                return {"ok": False, "max_error": error, "detail": f"{runs}; case {label}: {problem}"}
            if error >= worst_error:
                worst_error, worst_case, worst_tolerance = error, label, tolerance
    except Exception as error:  # a kernel that raises is a failed check, not a crashed report
        return {
            "ok": False,
            "max_error": math.inf,
            "detail": f"{runs}; case {label}: {type(error).__name__}: {error}",
        }
    bound = f"tolerance {worst_tolerance:.0e}" if worst_tolerance else "must be exact"
    count = f"{len(cases)} case{'s' if len(cases) != 1 else ''}"
    detail = f"{runs}; {count}, largest error {worst_error:.2g} in {worst_case} ({bound})"
    return {"ok": True, "max_error": worst_error, "detail": detail}


def _lm_head_with_gradients(function, args: dict) -> tuple:
    """(lp, entropy, grad_hidden, grad_weight) of `function` for the loss Σ g·lp + Σ e·entropy."""
    hidden = args["hidden"].detach().clone().requires_grad_()
    weight = args["weight"].detach().clone().requires_grad_()
    lp, entropy = function(hidden, weight, args["targets"], temperature=args["temperature"],
                           softcap=args["softcap"], return_entropy=True)
    (lp * args["grad_lp"] + entropy * args["grad_entropy"]).sum().backward()
    return lp.detach(), entropy.detach(), hidden.grad.float(), weight.grad.float()


def _lm_head_reference(args: dict) -> tuple:
    """The same through torch autograd on f64 logits of the given values."""
    hidden = args["hidden"].detach().double().requires_grad_()
    weight = args["weight"].detach().double().requires_grad_()
    logits = hidden @ weight.T
    if args["softcap"] > 0:
        logits = torch.tanh(logits / args["softcap"]) * args["softcap"]
    log_p = torch.log_softmax(logits / args["temperature"], dim=-1)
    lp = log_p.gather(-1, args["targets"][:, None]).squeeze(-1)
    entropy = torch.special.entr(log_p.exp()).sum(-1)
    (lp * args["grad_lp"] + entropy * args["grad_entropy"]).sum().backward()
    return lp.float().detach(), entropy.float().detach(), hidden.grad.float(), weight.grad.float()


def _expected(name: str, args: dict):
    if name == "lm_head_logprobs":
        return _lm_head_reference(args)
    if name == "fused_token_logprobs":
        # Logits in f64 rounded once to f32: the best f32 logits of the given values. The
        # reference's own f32 matmul may run in TF32 on a GPU where the user allowed it, and the
        # self-check must not blame the kernel for the reference's rounding.
        logits = (args["hidden"].double() @ args["weight"].double().T).float()
        return reference.token_logprobs(
            logits, args["targets"], args["mask"], args["temperature"], return_lse=args["return_lse"]
        )
    if name == "grpo_advantages":
        # The reference keeps a slot per id up to the largest (2^62 here); A depends only on
        # which rewards share an id, so hand it the same grouping with dense ids.
        args = dict(args, group_ids=torch.unique(args["group_ids"], return_inverse=True)[1])
    return getattr(reference, name)(**args)


def _difference(got, want, tolerance: float) -> tuple[float, str]:
    """(largest |got - want| over finite pairs, "" or what is wrong). tolerance is absolute, with
    a relative part of 1e-5 for float outputs; 0 means bit-equal values (NaN equal to NaN)."""
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return math.inf, f"expected a tuple of {len(want)} tensors, got {type(got).__name__}"
        worst = 0.0
        for index, (g, w) in enumerate(zip(got, want)):
            error, problem = _difference(g, w, tolerance)
            if problem:
                return error, f"output {index}: {problem}"
            worst = max(worst, error)
        return worst, ""
    if not isinstance(got, torch.Tensor):
        return math.inf, f"expected a tensor, got {type(got).__name__}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return math.inf, f"got {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
    g, w = got.double().cpu().flatten(), want.double().cpu().flatten()  # element indices are flat
    if not torch.equal(torch.isnan(g), torch.isnan(w)):
        index = int(torch.nonzero(torch.isnan(g) != torch.isnan(w))[0])
        return math.inf, f"element {index} is {g[index].item()}, reference {w[index].item()} (NaN mismatch)"
    infinite = torch.isinf(w) | torch.isinf(g)
    if not torch.equal(g[infinite], w[infinite]):
        index = int(torch.nonzero(infinite & (g != w))[0])
        return math.inf, f"element {index} is {g[index].item()}, reference {w[index].item()}"
    finite = torch.isfinite(g) & torch.isfinite(w)
    difference = (g[finite] - w[finite]).abs()
    error = float(difference.max()) if difference.numel() else 0.0
    allowed = tolerance + (1e-5 * w[finite].abs() if tolerance > 0 else 0.0)
    bad = difference > allowed
    if bool(bad.any()):
        index = int(torch.nonzero(finite)[int(torch.nonzero(bad)[0])])
        return error, (
            f"element {index} is {g[index].item():.7g}, reference {w[index].item():.7g} "
            f"(error {abs(g[index] - w[index]).item():.2g}, tolerance {tolerance:.0e})"
        )
    return error, ""


# ---- the cases: (label, kwargs, absolute tolerance) -----------------------------------------


def _logits(generator, rows: int, vocab: int, dtype, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=generator) * scale).to(dtype)


def _token_logprobs_cases(generator):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        short = str(dtype).removeprefix("torch.")
        for rows, vocab in ((5, 1), (4, 33), (3, 4099), (2, 32771)):
            logits = _logits(generator, rows, vocab, dtype)
            targets = torch.randint(0, vocab, (rows,), generator=generator)
            yield f"{short} T={rows} V={vocab}", dict(logits=logits, targets=targets, mask=None,
                                                    temperature=1.0, return_lse=True), 1e-4  # fmt: skip
        # Masked rows (targets there are never read), -inf entries, a NaN row, temperature != 1.
        logits = _logits(generator, 6, 257, dtype)
        logits[1, ::3] = float("-inf")
        logits[4, 7] = float("nan")
        mask = torch.tensor([True, True, False, True, True, False])
        targets = torch.where(mask, torch.randint(0, 257, (6,), generator=generator), -100)
        targets[1] = 1  # a finite entry of the -inf row
        yield f"{short} masked, -inf, NaN, T=0.7", dict(logits=logits, targets=targets, mask=mask,
                                                       temperature=0.7, return_lse=True), 1e-4  # fmt: skip
    # Large logits: the x - max must be formed before the scaling to stay exact.
    logits = _logits(generator, 3, 1000, torch.float32, scale=1.0) + 1e4
    yield "f32 logits ~1e4", dict(logits=logits, targets=torch.tensor([0, 5, 999]), mask=None,
                                  temperature=1.0, return_lse=True), 1e-3  # fmt: skip


def _fused_token_logprobs_cases(generator):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        short = str(dtype).removeprefix("torch.")
        hidden = (torch.randn(6, 37, generator=generator) * 0.5).to(dtype)
        weight = (torch.randn(1031, 37, generator=generator) * 0.5).to(dtype)
        targets = torch.randint(0, 1031, (6,), generator=generator)
        mask = torch.tensor([True, False, True, True, True, True])
        for chunk, temperature in ((256, 1.0), (1031, 0.6), (None, 1.7)):
            yield f"{short} T=6 H=37 V=1031 chunk={chunk} temperature={temperature}", dict(
                hidden=hidden, weight=weight, targets=targets, mask=mask, temperature=temperature,
                chunk_size=chunk, return_lse=True,
            ), 1e-3  # fmt: skip
        yield f"{short} H=0", dict(
            hidden=torch.zeros(3, 0, dtype=dtype), weight=torch.zeros(5, 0, dtype=dtype),
            targets=torch.tensor([0, 4, 2]), mask=None, temperature=1.0, chunk_size=2, return_lse=True,
        ), 1e-6  # fmt: skip


def _grpo_advantages_cases(generator):
    rewards = torch.randn(12, generator=generator)
    rewards[6:9] = 0.5  # a constant group
    ids = torch.tensor([0, 0, 0, 3, 3, 5, 7, 7, 7, 9, 9, 9])  # 5: a group of one; 1, 2, 4...: empty
    for norm_by_std in (True, False):
        for eps in (1e-6, 0.0):
            yield f"dense ids norm_by_std={norm_by_std} eps={eps}", dict(
                rewards=rewards, group_ids=ids, eps=eps, norm_by_std=norm_by_std
            ), 1e-6
    sparse = torch.tensor([2**40, 2**40, 7, 7, 2**62, 2**62])
    args = dict(rewards=rewards[:6], group_ids=sparse, eps=1e-6, norm_by_std=True)
    yield "sparse ids (2^40, 2^62)", args, 1e-6


def _pack(sequences, dtype):
    offsets = [0]
    for sequence in sequences:
        offsets.append(offsets[-1] + len(sequence))
    flat = [token for sequence in sequences for token in sequence]
    return torch.tensor(flat, dtype=dtype), torch.tensor(offsets, dtype=torch.int64)


def _splice_rubric_cases(generator):
    sequences = [[1, 2, 3], [], [4, 5], [6, 7, 8, 9], [10]]
    rubrics = [[100, 101, 102], [], [200]]
    for dtype in (torch.int64, torch.int32):
        ids, cu = _pack(sequences, dtype)
        rubric_ids, rubric_cu = _pack(rubrics, dtype)
        yield f"{str(dtype).removeprefix('torch.')} slots at both ends, empty sequence and rubric", dict(
            ids=ids, cu_seqlens=cu, slots=torch.tensor([0, 0, 2, 4, 99]), rubric_ids=rubric_ids,
            rubric_cu=rubric_cu, rubric_index=torch.tensor([0, 2, 1, 0, -1]),
        ), 0.0  # fmt: skip
    long_ids = torch.randint(0, 50_000, (3000,), generator=generator)
    cu = torch.tensor([0, 1000, 1000, 3000])
    rubric_ids, rubric_cu = _pack([list(range(300)), [7]], torch.int64)
    yield "S=3 L=3000", dict(
        ids=long_ids, cu_seqlens=cu, slots=torch.tensor([500, 0, 2000]), rubric_ids=rubric_ids,
        rubric_cu=rubric_cu, rubric_index=torch.tensor([0, 1, 0]),
    ), 0.0  # fmt: skip


def _shape_advantages_cases(generator):
    length, spliced, seqs = 40, 55, 4
    lp_plain = torch.randn(length, generator=generator)
    lp_rubric = torch.randn(spliced, generator=generator)
    lp_plain[3] = float("nan")
    lp_rubric[10] = float("-inf")
    pos_map = torch.randint(0, spliced, (length,), generator=generator)
    pos_map[5] = 10
    yield "NaN/-inf deltas, an ineligible sequence", dict(
        lp_plain=lp_plain, lp_rubric=lp_rubric, pos_map=pos_map,
        response_mask=torch.rand(length, generator=generator) < 0.7,
        seq_ids=torch.randint(0, seqs, (length,), generator=generator),
        seq_adv=torch.randn(seqs, generator=generator), alpha=0.5,
        eligible=torch.tensor([True, False, True, True]),
    ), 0.0  # fmt: skip


def _microbatch_weights_cases(generator):
    mask = torch.rand(50, generator=generator) < 0.6
    ids = torch.randint(0, 4, (50,), generator=generator)
    ids[ids == 2] = 3  # micro-batch 2 is empty
    mask[ids == 1] = False  # micro-batch 1 has no valid token
    args = dict(mask=mask, microbatch_ids=ids, num_microbatches=4)
    yield "an empty and an all-masked micro-batch", args, 0.0
    yield "D*G = 8, one micro-batch used", dict(
        mask=torch.ones(5, dtype=torch.bool), microbatch_ids=torch.full((5,), 6), num_microbatches=8
    ), 0.0


def _lm_head_logprobs_cases(generator):
    # A vocabulary of 1, one that crosses the 1,024 (CPU) / 4,096 (CUDA) block by a few rows, an odd
    # H, temperature and soft-cap; both incoming gradients non-zero. Gradients are O(0.1) here, so
    # the absolute tolerances are the relative bounds of docs/ops.md.
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2), (torch.float16, 5e-3)):
        short = str(dtype).removeprefix("torch.")
        for rows, hidden_size, vocab, temperature, softcap in ((3, 8, 1, 1.0, 0.0), (7, 37, 4099, 0.7, 0.0),
                                                               (5, 64, 1030, 1.0, 4.0)):
            hidden = torch.randn(rows, hidden_size, generator=generator).to(dtype)
            weight = (torch.randn(vocab, hidden_size, generator=generator) * 2 / hidden_size**0.5).to(dtype)
            yield f"{short} T={rows} H={hidden_size} V={vocab} temperature={temperature} softcap={softcap}", dict(
                hidden=hidden, weight=weight, targets=torch.randint(0, vocab, (rows,), generator=generator),
                temperature=temperature, softcap=softcap, grad_lp=torch.rand(rows, generator=generator) + 0.5,
                grad_entropy=torch.rand(rows, generator=generator) * 0.1,
            ), tolerance  # fmt: skip


_CASES = {
    "token_logprobs": _token_logprobs_cases,
    "fused_token_logprobs": _fused_token_logprobs_cases,
    "grpo_advantages": _grpo_advantages_cases,
    "splice_rubric": _splice_rubric_cases,
    "shape_advantages": _shape_advantages_cases,
    "microbatch_weights": _microbatch_weights_cases,
    "lm_head_logprobs": _lm_head_logprobs_cases,
}
