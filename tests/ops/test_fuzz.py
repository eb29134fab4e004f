"""Hostile-input fuzzing of every op (issue 12): whatever hypothesis throws at an op, the answer is
either the reference's (orsd/ops/reference.py, within the op's tolerance) or a ValueError whose
message starts with the name of one of the op's arguments. Never a crash, never another
exception, never a different number.

Cases start from a valid input (random shapes, dtypes, values with NaN/inf, masks, tensors at a
storage offset) and most then get one mutation: a layout the kernels cannot read (non-contiguous,
transposed, stride 0, negative-bit view, ZeroTensor, freed storage, sparse, meta, a list), a wrong
dtype or rank, hostile numbers (INT64_MAX/MIN, 2^40 ids, unsorted or wrapping offsets, subnormal
or huge temperatures, 10**400), or a wrong length. An unmutated case must not be refused.

Each op is fuzzed in its own subprocess (this file run as a script), so a segfault is a failed
test that shows the case being run, not a dead pytest. Hypothesis runs derandomized without a
database: every run tries the same cases. `python tests/ops/test_fuzz.py` prints the figures for
all ops; `python tests/ops/test_fuzz.py OP N [DEVICE]` fuzzes one op with N examples.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import warnings
from fractions import Fraction

import numpy
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orsd.ops
from orsd.ops import reference

EXAMPLES = {
    "token_logprobs": 1000,
    "fused_token_logprobs": 800,
    "grpo_advantages": 1000,
    "splice_rubric": 1000,
    "shape_advantages": 1000,
    "microbatch_weights": 1000,
}
PARAMS = {
    "token_logprobs": ("logits", "targets", "mask", "temperature", "return_lse"),
    "fused_token_logprobs": (
        "hidden", "weight", "targets", "mask", "temperature", "chunk_size", "return_lse",
    ),  # fmt: skip
    "grpo_advantages": ("rewards", "group_ids", "eps", "norm_by_std"),
    "splice_rubric": ("ids", "cu_seqlens", "slots", "rubric_ids", "rubric_cu", "rubric_index"),
    "shape_advantages": (
        "lp_plain", "lp_rubric", "pos_map", "response_mask", "seq_ids", "seq_adv", "alpha", "eligible",
    ),  # fmt: skip
    "microbatch_weights": ("mask", "microbatch_ids", "num_microbatches"),
}


# ---- pytest side: one subprocess per op ----------------------------------------------------------


def run_fuzz(op: str, examples: int, device: str = "cpu") -> dict:
    """Fuzz `op` in a subprocess; returns its summary or fails the test with the case it died on."""
    with tempfile.TemporaryDirectory() as scratch:
        last_case = os.path.join(scratch, "last_case.txt")
        env = dict(os.environ, ORSD_FUZZ_LAST_CASE=last_case)
        proc = subprocess.run(
            [sys.executable, __file__, op, str(examples), device],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        if proc.returncode != 0:
            case = open(last_case).read() if os.path.exists(last_case) else "(none recorded)"
            pytest.fail(
                f"{op} fuzz exited with {proc.returncode} (negative: killed by that signal)\n"
                f"case being run:\n{case}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
                f"--- stderr ---\n{proc.stderr[-6000:]}",
                pytrace=False,
            )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _report(summary: dict) -> str:
    return (
        f"fuzz {summary['op']} on {summary['device']}: {summary['cases']} cases, "
        f"{summary['value_errors']} clean ValueErrors, {summary['results']} results equal to the "
        f"reference, 0 crashes, 0 wrong results, {summary['seconds']:.1f} s "
        f"({summary['cpu_seconds']:.1f} s CPU)"
    )


@pytest.mark.parametrize("op", list(EXAMPLES))
def test_fuzz_op_gives_the_reference_or_a_value_error(op):
    summary = run_fuzz(op, EXAMPLES[op])
    print(_report(summary))
    assert summary["cases"] >= EXAMPLES[op]
    # Both outcomes must be exercised, or the mutations (or the valid cases) have gone dead.
    assert summary["value_errors"] > EXAMPLES[op] // 5, summary
    assert summary["results"] > EXAMPLES[op] // 5, summary


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(EXAMPLES))
def test_fuzz_op_on_cuda(op):
    summary = run_fuzz(op, EXAMPLES[op] // 4, "cuda")
    print(_report(summary))


# ---- the fuzzer (runs in the subprocess) -------------------------------------------------------

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
HOSTILE_INTS = (I64_MAX, I64_MIN, -1, -100, 2**31, 2**32 + 1, 2**40, 2**62)
HOSTILE_REALS = (
    0, 0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e-45, 1e-39, 1e-7, 1e39, 10**400,
    True, "1.0", None, Fraction(10**500, 3),
)  # fmt: skip


class Case:
    """One op call: its keyword arguments and the mutation applied (None: a valid input)."""

    def __init__(self, args: dict, mutation: str | None = None):
        self.args = args
        self.mutation = mutation

    def describe(self) -> str:
        lines = [f"mutation: {self.mutation}"]
        for name, value in self.args.items():
            lines.append(f"  {name} = {_describe(value)}")
        return "\n".join(lines)


def _describe(value) -> str:
    if not isinstance(value, torch.Tensor):
        return repr(value)[:200]
    flags = [f for f in ("is_neg", "is_conj", "_is_zerotensor") if getattr(value, f)()]
    head = f"Tensor{tuple(value.shape)} {value.dtype} {value.device} {value.layout} strides=" + (
        str(value.stride()) if value.layout == torch.strided else "-"
    )
    try:
        shown = value.reshape(-1)[:24].tolist() if value.layout == torch.strided else "sparse"
    except Exception as error:  # freed storage, meta, ZeroTensor: the description must not die
        shown = f"<unreadable: {type(error).__name__}>"
    return f"{head} {' '.join(flags)} {shown}"


class Draw:
    """Hypothesis draws for sizes and small ints (its bias to 0, 1 and the bounds is what finds
    edge cases), and a random.Random seeded by hypothesis for categorical picks: hypothesis'
    own sampled_from, derandomized, keeps to the first few options, and the mutations must all
    get their turn."""

    def __init__(self, data):
        self.data = data
        self.rng = random.Random(data.draw(st.integers(0, 2**64 - 1)))

    def int(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))

    def bool(self, p_true: float = 0.5) -> bool:
        return self.rng.random() < p_true

    def choice(self, options):
        return self.rng.choice(list(options))

    def generator(self):
        return torch.Generator().manual_seed(self.rng.getrandbits(63))


# ---- valid values ------------------------------------------------------------------------------


def random_floats(draw: Draw, shape, dtype, scales, special: bool = True):
    """Normal values times a drawn scale, in `dtype`, sometimes with NaN and +-inf sprinkled in."""
    generator = draw.generator()
    scale = draw.choice(scales)
    values = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    limit = torch.finfo(dtype).max
    values = values.clamp(-limit, limit).to(dtype)  # finite unless NaN/inf are sprinkled in below
    if special and values.numel() and draw.bool(0.2):
        flat = values.view(-1)
        for _ in range(draw.int(1, 3)):
            flat[draw.int(0, flat.numel() - 1)] = draw.choice([float("nan"), float("inf"), float("-inf")])
    return values


def random_ints(draw: Draw, shape, low: int, high: int):
    """Uniform ints in [low, high) (high - low may be up to 2^63)."""
    if high <= low:
        return torch.full(shape, low, dtype=torch.int64)
    generator = draw.generator()
    span = high - low
    if span < 2**62:
        return torch.randint(low, high, shape, generator=generator, dtype=torch.int64)
    # Too wide for randint: the first 2^62 values of the range (still spanning every magnitude).
    return low + torch.randint(0, 2**62, shape, generator=generator, dtype=torch.int64)


def random_mask(draw: Draw, n: int):
    kind = draw.choice(["random", "all", "none"])
    if kind == "all":
        return torch.ones(n, dtype=torch.bool)
    if kind == "none":
        return torch.zeros(n, dtype=torch.bool)
    return torch.rand(n, generator=draw.generator()) < 0.6


def pack(lengths):
    """cu offsets for sequences of these lengths."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int64)


def at_offset(draw: Draw, x):
    """x in a contiguous tensor that starts inside a larger storage (valid: data_ptr moves)."""
    pad = draw.int(1, 5)
    buffer = torch.zeros(pad + x.numel(), dtype=x.dtype, device=x.device)
    buffer[pad:] = x.reshape(-1)
    return buffer[pad:].view(x.shape)


# ---- mutations -----------------------------------------------------------------------------------

LAYOUTS = ("strided", "transposed", "expanded", "neg", "conj", "zero", "freed", "sparse", "meta", "list",
           "dtype", "rank", "bool bytes")  # fmt: skip


def relayout(draw: Draw, x, kind: str):
    """x's values (for 'expanded', its first value) in another form: mostly ones the kernels
    cannot read as they are; 'bool bytes' (True stored as 2) is valid, if odd."""
    if kind == "strided":  # every other element of a larger buffer
        if x.dim() == 1:
            buffer = torch.zeros(2 * x.shape[0] + 1, dtype=x.dtype, device=x.device)
            buffer[::2][: x.shape[0]] = x
            return buffer[: 2 * x.shape[0] : 2]
        buffer = torch.zeros(x.shape[0], 2 * x.shape[1], dtype=x.dtype, device=x.device)
        buffer[:, ::2] = x
        return buffer[:, ::2]
    if kind == "transposed" and x.dim() == 2:
        return x.T.contiguous().T
    if kind == "expanded" and x.numel() > 0:
        return x.reshape(-1)[:1].reshape([1] * x.dim()).expand(x.shape)
    if kind == "neg" and x.dtype != torch.bool:
        return torch._neg_view(-x)  # means x, stores -x
    if kind == "conj":
        return x.to(torch.complex64).conj()
    if kind == "zero":
        return torch._efficientzerotensor(x.shape, dtype=x.dtype, device=x.device)
    if kind == "freed" and x.numel() > 0:
        y = x.clone()
        y.untyped_storage().resize_(0)
        return y
    if kind == "sparse":
        return x.to_sparse()
    if kind == "meta":
        return x.to("meta")
    if kind == "list":
        return x.tolist()
    if kind == "dtype":
        others = [d for d in (torch.float64, torch.float16, torch.int32, torch.int64, torch.bool, torch.uint8)
                  if d != x.dtype]  # fmt: skip
        return x.to(draw.choice(others))
    if kind == "bool bytes" and x.dtype == torch.bool:
        return (x.to(torch.uint8) * 2).view(torch.bool)
    if kind == "rank":
        return x.unsqueeze(0) if x.dim() == 1 else x.reshape(-1)
    return x.clone()  # the layout does not apply to this tensor: an ordinary valid one


def mutate(draw: Draw, case: Case, value_mutations: dict, device) -> Case:
    """Place the valid case on the device, applying at most one mutation: one of the op's own
    value mutations (name -> function(case), applied before placing), a layout one on a random
    tensor argument, a hostile scalar, or a wrong length."""
    # 30% valid, 25% an op-specific value, 25% a layout, 12% a hostile scalar, 8% a wrong length.
    which = draw.rng.randrange(100)
    if 30 <= which < 55 and value_mutations:
        name = draw.choice(sorted(value_mutations))
        value_mutations[name](case)
        case.mutation = name
    place_valid(draw, case, device)
    if which < 55:
        return case
    tensors = [n for n, v in case.args.items() if isinstance(v, torch.Tensor)]
    scalars = [n for n, v in case.args.items() if not isinstance(v, torch.Tensor)]
    with torch.no_grad():
        if which < 80 and tensors:
            name = draw.choice(tensors)
            kind = draw.choice(LAYOUTS)
            case.args[name] = relayout(draw, case.args[name], kind)
            case.mutation = f"{kind} {name}"
        elif which < 92 and scalars:
            name = draw.choice(scalars)
            case.args[name] = draw.choice(HOSTILE_REALS + HOSTILE_INTS + (2.5, 2**64))
            case.mutation = f"hostile {name}"
        elif tensors:
            name = draw.choice(tensors)
            x = case.args[name]
            if x.dim() == 1:
                extra = torch.zeros(1, dtype=x.dtype, device=x.device)
                case.args[name] = x[1:].clone() if x.shape[0] and draw.bool() else torch.cat([x, extra])
            else:
                case.args[name] = x[:, 1:].clone() if draw.bool() else x[1:].clone()
            case.mutation = f"length {name}"
    return case


def place_valid(draw: Draw, case: Case, device) -> Case:
    """Move every tensor to the device; some at a storage offset or requiring grad (both valid)."""
    for name, value in case.args.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            if value.numel() and draw.bool(0.25):
                value = at_offset(draw, value)
            if value.is_floating_point() and draw.bool(0.1):
                value = value.detach().requires_grad_()
            case.args[name] = value
    return case


# ---- builders: one valid case per op, then its op-specific value mutations ---------------------

TEMPERATURES = (1.0, 0.7, 2.0, 1e-6, 1e-3, 0.05, 1e3, 1e6, 3e38, 0.5)


def _temperature(draw: Draw):
    kind = draw.int(0, 9)
    if kind < 6:
        return draw.choice(TEMPERATURES)
    if kind < 8:
        return 10 ** (draw.int(-600, 3800) / 100)  # 1e-6 .. 1e38, log-uniform
    return draw.choice([numpy.float32(0.5), numpy.float64(1.5), Fraction(3, 2), 2])


def _set_live_target(case: Case, value: int):
    """targets[t] = value on the first unmasked row (there, it is read)."""
    mask = case.args["mask"]
    rows = torch.arange(case.args["targets"].shape[0]) if mask is None else torch.nonzero(mask).reshape(-1)
    if rows.numel():
        case.args["targets"][rows[0]] = value


def build_token_logprobs(draw: Draw) -> tuple[Case, dict]:
    T = draw.int(0, 9)
    V = draw.choice([draw.int(1, 70)] * 3 + [127, 128, 129, 4095, 4097])
    dtype = draw.choice([torch.float32, torch.float16, torch.bfloat16])
    scales = (1e-3, 1.0, 30.0, 1e4) + ((1e30, 3e38) if dtype != torch.float16 else (6e4,))
    logits = random_floats(draw, (T, V), dtype, scales)
    targets = random_ints(draw, (T,), 0, V)
    mask = random_mask(draw, T) if draw.bool(0.6) else None
    if mask is not None and T:  # anything goes on masked rows
        junk = torch.tensor([-100, I64_MIN, I64_MAX, V], dtype=torch.int64)
        targets = torch.where(mask, targets, junk[torch.arange(T) % 4])
    case = Case(dict(logits=logits, targets=targets, mask=mask, temperature=_temperature(draw),
                     return_lse=draw.bool()))  # fmt: skip
    value_mutations = {
        "target V on a live row": lambda c: _set_live_target(c, V),
        "target -1 on a live row": lambda c: _set_live_target(c, -1),
        "target INT64_MIN on a live row": lambda c: _set_live_target(c, I64_MIN),
        "target INT64_MAX on a live row": lambda c: _set_live_target(c, I64_MAX),
        "subnormal temperature": lambda c: c.args.update(temperature=draw.choice([1e-45, 1e-38, 5e-7])),
        "no vocabulary": lambda c: c.args.update(logits=torch.zeros(T, 0, dtype=dtype)),
    }
    return case, value_mutations


def build_fused_token_logprobs(draw: Draw) -> tuple[Case, dict]:
    T = draw.int(0, 7)
    H = draw.choice([0, 1, 2, 3, 8, 13, 16, 24])
    V = draw.choice([draw.int(1, 50)] * 3 + [129, 300])
    dtype = draw.choice([torch.float32, torch.float16, torch.bfloat16])
    # Elements up to 1e17 keep every sum of H <= 24 products below 1e36 (no overflow in the GEMM,
    # whose order differs from the reference's) while logits / T can still leave the f32 range.
    scales = (1e-2, 1.0, 30.0) + ((1e3, 1e17) if dtype != torch.float16 else (100.0,))
    hidden = random_floats(draw, (T, H), dtype, scales)
    weight = random_floats(draw, (V, H), dtype, scales, special=draw.bool(0.3))
    targets = random_ints(draw, (T,), 0, V)
    mask = random_mask(draw, T) if draw.bool(0.5) else None
    chunk_size = draw.choice([None, None, 1, 3, 7, 16, V, V + 1, 2**40])
    case = Case(dict(hidden=hidden, weight=weight, targets=targets, mask=mask, temperature=_temperature(draw),
                     chunk_size=chunk_size, return_lse=draw.bool()))  # fmt: skip
    other = [d for d in (torch.float32, torch.float16, torch.bfloat16) if d != dtype]
    value_mutations = {
        "weight of another dtype": lambda c: c.args.update(weight=weight.to(draw.choice(other))),
        "weight of another H": lambda c: c.args.update(weight=torch.zeros(V, H + 1, dtype=dtype)),
        "no vocabulary": lambda c: c.args.update(weight=torch.zeros(0, H, dtype=dtype)),
        "target V on a live row": lambda c: _set_live_target(c, V),
        "target INT64_MIN on a live row": lambda c: _set_live_target(c, I64_MIN),
        "hostile chunk_size": lambda c: c.args.update(chunk_size=draw.choice([0, -1, 2.5, True, 2**64, "8"])),
        "subnormal temperature": lambda c: c.args.update(temperature=draw.choice([1e-45, 1e-39, 9e-7])),
    }
    return case, value_mutations


def build_grpo_advantages(draw: Draw) -> tuple[Case, dict]:
    N = draw.int(0, 12)
    kind = draw.choice(["dense", "dense", "sparse", "huge"])
    if kind == "dense":
        pool = list(range(draw.int(1, 5)))
    elif kind == "sparse":
        pool = [draw.int(0, 2**20) for _ in range(3)]
    else:  # ids near 2^40 once tried to allocate 26 TB
        pool = [2**40 + 7, 2**40, I64_MAX, 2**62, 3]
    group_ids = torch.tensor([draw.choice(pool) for _ in range(N)], dtype=torch.int64)
    rewards = random_floats(draw, (N,), torch.float32, (1.0, 1e-30, 1e30, 3e38), special=False)
    if N and draw.bool(0.3):  # constant groups and ties
        rewards = rewards[:1].expand(N).clone() if draw.bool() else rewards.round()
    eps = draw.choice([1e-6, 0.0, 1.0, 1e30, 0, numpy.float64(1e-8)])
    case = Case(dict(rewards=rewards, group_ids=group_ids, eps=eps, norm_by_std=draw.bool()))

    def set_id(value):
        def apply(c):
            if N:
                c.args["group_ids"][draw.int(0, N - 1)] = value
        return apply

    def set_reward(value):
        def apply(c):
            if N:
                c.args["rewards"][draw.int(0, N - 1)] = value
        return apply

    value_mutations = {
        "negative group id": set_id(-1),
        "group id INT64_MIN": set_id(I64_MIN),
        "group id 2^40": set_id(2**40),
        "group id INT64_MAX": set_id(I64_MAX),
        "NaN reward": set_reward(float("nan")),
        "inf reward": set_reward(float("-inf")),
        "int32 group ids": lambda c: c.args.update(group_ids=group_ids.to(torch.int32)),
        "norm_by_std not a bool": lambda c: c.args.update(
            norm_by_std=draw.choice([1, "yes", None, numpy.bool_(True)])
        ),
    }
    return case, value_mutations


def _hostile_offsets(draw: Draw, cu):
    """Offsets that the old step check let through or that index outside the buffer."""
    cu = cu.clone()
    n = cu.shape[0]
    kind = draw.choice(["wrap", "wrap", "entry", "shuffle", "shift", "end"])
    if kind == "wrap" and n >= 3:
        # The hostile tester's [0, INT64_MAX, INT64_MIN, -1, L]: every int64 difference of
        # neighbours is >= 0 (MIN - MAX wraps to 1), so a step check let it through.
        prefix = [0, I64_MAX, I64_MIN, -1][: n - 1]
        return torch.tensor(prefix + cu[len(prefix) :].tolist(), dtype=torch.int64)
    if kind == "entry":
        cu[draw.int(0, n - 1)] = draw.choice(HOSTILE_INTS + (int(cu[-1]) + 1,))
    elif kind == "shuffle":
        cu = cu[torch.randperm(n, generator=draw.generator())]
    elif kind == "shift":
        cu = cu + draw.choice([1, -1, I64_MAX])
    else:
        cu[-1] = cu[-1] + draw.choice([1, -1])
    return cu


def build_splice_rubric(draw: Draw) -> tuple[Case, dict]:
    S = draw.choice(range(7))  # uniform: the wrapping offsets need S >= 4
    J = draw.choice(range(6))
    lengths = [draw.int(0, 6) for _ in range(S)]
    rubric_lengths = [draw.int(0, 4) for _ in range(J)]
    dtype = draw.choice([torch.int64, torch.int32])
    ids = random_ints(draw, (sum(lengths),), 0, 2**31 - 1).to(dtype)
    rubric_ids = random_ints(draw, (sum(rubric_lengths),), 0, 2**31 - 1).to(dtype)
    rubric_index = torch.tensor([draw.int(-1, J - 1) for _ in range(S)], dtype=torch.int64)
    # A slot is not read where no rubric goes in: anything there.
    slots = torch.tensor(
        [draw.int(0, n) if j >= 0 else draw.choice(HOSTILE_INTS + (0, 3)) for n, j in zip(lengths, rubric_index)],
        dtype=torch.int64,
    )
    case = Case(dict(ids=ids, cu_seqlens=pack(lengths), slots=slots, rubric_ids=rubric_ids,
                     rubric_cu=pack(rubric_lengths), rubric_index=rubric_index))  # fmt: skip
    live = [s for s in range(S) if rubric_index[s] >= 0]

    def bad_slot(c):
        if live:
            s = draw.choice(live)
            c.args["slots"][s] = draw.choice([lengths[s] + 1, -1, I64_MAX, I64_MIN])

    def bad_index(c):
        if S:
            c.args["rubric_index"][draw.int(0, S - 1)] = draw.choice([J, -2, I64_MIN, I64_MAX])

    value_mutations = {
        "hostile cu_seqlens": lambda c: c.args.update(cu_seqlens=_hostile_offsets(draw, c.args["cu_seqlens"])),
        "hostile rubric_cu": lambda c: c.args.update(rubric_cu=_hostile_offsets(draw, c.args["rubric_cu"])),
        "slot outside its sequence": bad_slot,
        "rubric_index outside [-1, J)": bad_index,
        "rubric_ids of another dtype": lambda c: c.args.update(
            rubric_ids=rubric_ids.to(torch.int32 if dtype == torch.int64 else torch.int64)
        ),
        "empty cu_seqlens": lambda c: c.args.update(cu_seqlens=torch.zeros(0, dtype=torch.int64)),
    }
    return case, value_mutations


def build_shape_advantages(draw: Draw) -> tuple[Case, dict]:
    L = draw.int(0, 12)
    S = draw.int(1 if L else 0, 4)
    L2 = draw.int(1 if L else 0, 15)
    lp_plain = random_floats(draw, (L,), torch.float32, (1.0, 30.0, 1e30))
    lp_rubric = random_floats(draw, (L2,), torch.float32, (1.0, 30.0, 1e30))
    case = Case(dict(
        lp_plain=lp_plain, lp_rubric=lp_rubric, pos_map=random_ints(draw, (L,), 0, L2),
        response_mask=random_mask(draw, L), seq_ids=random_ints(draw, (L,), 0, S),
        seq_adv=random_floats(draw, (S,), torch.float32, (1.0, 1e30)),
        alpha=draw.choice([0.0, 0.5, -3.0, 1e38, 1, Fraction(1, 3), -3.4e38]), eligible=random_mask(draw, S),
    ))  # fmt: skip

    def set_index(name, high):
        def apply(c):
            if L:
                c.args[name][draw.int(0, L - 1)] = draw.choice([high, -1, I64_MAX, I64_MIN])
        return apply

    value_mutations = {
        "pos_map outside lp_rubric": set_index("pos_map", L2),
        "seq_ids outside seq_adv": set_index("seq_ids", S),
        "eligible of another length": lambda c: c.args.update(eligible=torch.ones(S + 1, dtype=torch.bool)),
    }
    return case, value_mutations


def build_microbatch_weights(draw: Draw) -> tuple[Case, dict]:
    L = draw.int(0, 12)
    big = (2**63 - 1) // max(L, 1)
    K = draw.choice([1, 2, 3, 5, 16, 70_000, 2**40, big, numpy.int64(4)])
    case = Case(dict(mask=random_mask(draw, L), microbatch_ids=random_ints(draw, (L,), 0, int(K)),
                     num_microbatches=K))  # fmt: skip

    def set_id(c):
        if L:
            c.args["microbatch_ids"][draw.int(0, L - 1)] = draw.choice([int(K), -1, I64_MAX, I64_MIN])

    value_mutations = {
        "micro-batch id outside [0, K)": set_id,
        "K * L beyond int64": lambda c: c.args.update(num_microbatches=big + 1),
    }
    return case, value_mutations


BUILDERS = {
    "token_logprobs": build_token_logprobs,
    "fused_token_logprobs": build_fused_token_logprobs,
    "grpo_advantages": build_grpo_advantages,
    "splice_rubric": build_splice_rubric,
    "shape_advantages": build_shape_advantages,
    "microbatch_weights": build_microbatch_weights,
}


def known_cases(op: str) -> list[Case]:
    """The hostile tester's findings, run before the random cases (all must now be refused or
    answered right)."""
    long = torch.int64
    cases = {
        "splice_rubric": [
            Case(dict(ids=torch.arange(20), cu_seqlens=torch.tensor([0, I64_MAX, I64_MIN, -1, 20]),
                      slots=torch.zeros(4, dtype=long), rubric_ids=torch.arange(3),
                      rubric_cu=torch.tensor([0, 3]), rubric_index=torch.zeros(4, dtype=long)), "tester: wrap"),
            # Rubric 3 would be rubric_ids[-1:3]: one token before the buffer.
            Case(dict(ids=torch.arange(4), cu_seqlens=torch.tensor([0, 4]), slots=torch.tensor([1]),
                      rubric_ids=torch.arange(3), rubric_cu=torch.tensor([0, I64_MAX, I64_MIN, -1, 3]),
                      rubric_index=torch.tensor([3])), "tester: wrapping rubric_cu"),
            Case(dict(ids=torch.arange(4), cu_seqlens=torch.tensor([0, 4]), slots=torch.tensor([1]),
                      rubric_ids=torch.arange(3), rubric_cu=torch.tensor([0, 2, 1, 3]),
                      rubric_index=torch.tensor([1])), "tester: unsorted rubric_cu"),
        ],  # fmt: skip
        "fused_token_logprobs": [
            Case(dict(hidden=torch.zeros(3, 0, dtype=dt), weight=torch.zeros(5, 0, dtype=dt),
                      targets=torch.tensor([0, 4, 2]), mask=None, temperature=1.0, chunk_size=None,
                      return_lse=True), None)
            for dt in (torch.bfloat16, torch.float16, torch.float32)
        ] + [
            Case(dict(hidden=torch.tensor([[1e19]]), weight=torch.tensor([[2e19], [-2e19], [0.0]]),
                      targets=torch.tensor([0]), mask=None, temperature=1e38, chunk_size=1, return_lse=True),
                 None),
        ],  # fmt: skip
        "token_logprobs": [
            Case(dict(logits=torch._neg_view(-torch.randn(3, 7)), targets=torch.tensor([0, 1, 2]), mask=None,
                      temperature=1.0, return_lse=False), "tester: neg view"),
            Case(dict(logits=torch.tensor([[1.0, 0.0]]), targets=torch.tensor([1]), mask=None,
                      temperature=1e-45, return_lse=False), "tester: subnormal temperature"),
            Case(dict(logits=torch.tensor([[1e33, 0.0, -1e33]]), targets=torch.tensor([1]), mask=None,
                      temperature=1e-6, return_lse=True), None),
            Case(dict(logits=torch._efficientzerotensor(2, 3), targets=torch.tensor([0, 1]), mask=None,
                      temperature=1.0, return_lse=False), "ZeroTensor"),
            # x - max overflows f32 before the 1/T scaling; (x - max) / T = -4 does not.
            Case(dict(logits=torch.tensor([[2e38, -2e38, 0.0]]), targets=torch.tensor([0]), mask=None,
                      temperature=1e38, return_lse=True), None),
        ],  # fmt: skip
        "grpo_advantages": [
            Case(dict(rewards=torch.tensor([1.0, 2.0, 3.0, 5.0]), group_ids=torch.tensor([2**40, 2**40, 7, 7]),
                      eps=1e-6, norm_by_std=True), None),
            Case(dict(rewards=torch.tensor([1.0, 2.0]), group_ids=torch.tensor([I64_MAX, I64_MAX]),
                      eps=1e-6, norm_by_std=False), None),
        ],  # fmt: skip
        "microbatch_weights": [
            Case(dict(mask=torch.tensor([True, True, False]), microbatch_ids=torch.tensor([0, 2**40, 5]),
                      num_microbatches=2**40 + 1), None),
        ],  # fmt: skip
    }
    return cases.get(op, [])


# ---- the oracle ----------------------------------------------------------------------------------


def expected(op: str, args: dict):
    """The reference's answer for args (raises if the reference cannot compute it: then the op
    should have refused the input)."""
    # The wrappers take any real (NumPy scalars, Fractions) and hand the reference a float.
    args = {k: float(v) if k in ("temperature", "eps", "alpha") else v for k, v in args.items()}
    if op == "grpo_advantages":
        ids = args["group_ids"]
        if isinstance(ids, torch.Tensor) and ids.numel() and int(ids.min()) >= 0:
            # The reference keeps one slot per id up to the largest; A depends only on which
            # rewards share an id, so give it the same grouping with dense ids.
            args = dict(args, group_ids=torch.unique(ids, return_inverse=True)[1])
    if op == "microbatch_weights" and int(args["num_microbatches"]) > 2**20:
        # The reference allocates num_microbatches counters: evaluate its formula over the ids
        # present (num_microbatches * count in exact int64, then one f32 division).
        mask, ids, k = args["mask"], args["microbatch_ids"], int(args["num_microbatches"])
        dense = torch.unique(ids, return_inverse=True)[1]
        counts = torch.zeros(ids.numel(), dtype=torch.int64, device=ids.device)
        counts.index_add_(0, dense, mask.long())
        denominators = (k * counts[dense]).clamp(min=1).to(torch.float32)
        return torch.where(mask, 1.0 / denominators, torch.zeros_like(denominators))
    return getattr(reference, op)(**args)


def tolerance(op: str, args: dict, want):
    """Allowed |got - want| per element, the documented agreement plus the part the reference's
    own rounding can account for: x / T and max / T rounded separately (torch) against x - max
    formed first (the kernels) at |x / T| up to 3e38, and the GEMM's summation order (fused)."""
    if op in ("splice_rubric", "shape_advantages", "microbatch_weights"):
        return 0.0
    if op == "grpo_advantages":
        return 1e-6 + 1e-6 * want.abs()
    eps32 = 2.0**-24
    temperature = float(args["temperature"])
    if op == "token_logprobs":
        logits = args["logits"].double()
        gemm = torch.zeros(logits.shape[0], dtype=torch.float64, device=logits.device)
        base = 1e-4
    else:
        hidden, weight = args["hidden"].double(), args["weight"].double()
        logits = hidden @ weight.T
        size = hidden.shape[1]
        products = hidden.abs().nan_to_num(posinf=0) @ weight.abs().nan_to_num(posinf=0).T
        gemm = 4 * (size + 2) * eps32 * products.amax(dim=1) / temperature
        base = 1e-3
    finite = logits.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    magnitude = (finite / temperature).abs().amax(dim=1)
    return base + 8 * eps32 * magnitude + gemm


def compare(op: str, args: dict, got, want) -> str | None:
    """None when got matches want: same type, dtype and shape; NaN exactly where want has NaN;
    the same infinities; elsewhere within the tolerance."""
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"expected a tuple of {len(want)}, got {type(got).__name__}"
        for i, (g, w) in enumerate(zip(got, want)):
            problem = compare(op, args, g, w)
            if problem:
                return f"output {i}: {problem}"
        return None
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    if got.dtype != want.dtype or got.shape != want.shape or got.device != want.device:
        return f"got {got.dtype}{tuple(got.shape)} on {got.device}, want {want.dtype}{tuple(want.shape)}"
    if got.requires_grad:
        return "the output requires grad"
    if not want.is_floating_point():
        return None if torch.equal(got, want) else f"got {got.tolist()}, want {want.tolist()}"
    tol = tolerance(op, args, want)
    g, w = got.double(), want.double()
    if op == "fused_token_logprobs":
        # Rows whose largest |logit / T| sits within 1e-3 of the f32 limit overflow on one side of
        # a GEMM rounding and not the other: NaN there is as right as a number.
        hidden, weight = args["hidden"].double(), args["weight"].double()
        scaled = ((hidden @ weight.T) / float(args["temperature"])).abs().nan_to_num(0, 0, 0)
        edge = (scaled.amax(dim=1) - 3.4028234663852886e38).abs() < 1e-3 * 3.4e38
        g, w = torch.where(edge, 0.0, g), torch.where(edge, 0.0, w)
    ok = torch.where(
        torch.isnan(w), torch.isnan(g), torch.where(torch.isinf(w), g == w, (g - w).abs() <= tol)
    )  # (g - w) is NaN or inf where g is not finite: not <= tol
    if bool(ok.all()):
        return None
    bad = int(torch.nonzero(~ok)[0])
    limit = float(tol) if isinstance(tol, float) else float(tol.reshape(-1)[bad])
    return f"element {bad}: got {float(g[bad])!r}, want {float(w[bad])!r} (tolerance {limit:.3g})"


def fuzz(op: str, examples: int, device: str) -> dict:
    # The cases are tiny (the kernels keep anything under 32k elements on one thread anyway),
    # and on a loaded 2-core machine torch's own small ops spend milliseconds in OpenMP barriers.
    torch.set_num_threads(1)
    function = getattr(orsd.ops, op)
    last_case = os.environ.get("ORSD_FUZZ_LAST_CASE")
    counts = {"cases": 0, "value_errors": 0, "results": 0}
    message_start = re.compile(r"^(\w+)[: (]")

    def check(case: Case) -> None:
        if last_case:  # survives a segfault: the parent shows it
            with open(last_case, "w") as f:
                f.write(case.describe())
        counts["cases"] += 1
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # the reference fallback must not run silently
            try:
                got = function(**case.args)
            except ValueError as error:
                named = message_start.match(str(error))
                assert named and named.group(1) in PARAMS[op], f"the ValueError names no argument: {error}"
                assert case.mutation is not None, f"a valid input was refused: {error}\n{case.describe()}"
                counts["value_errors"] += 1
                return
            except Exception as error:
                raise AssertionError(
                    f"{type(error).__name__} instead of ValueError: {error}\n{case.describe()}"
                ) from error
        try:
            want = expected(op, case.args)
        except Exception as error:
            raise AssertionError(
                f"the op accepted an input the reference cannot compute ({type(error).__name__}: "
                f"{error})\n{case.describe()}"
            ) from error
        problem = compare(op, case.args, got, want)
        assert problem is None, f"wrong result: {problem}\n{case.describe()}"
        counts["results"] += 1

    started, cpu_started = time.perf_counter(), time.process_time()
    for case in known_cases(op):
        case.args = {k: v.to(device) if isinstance(v, torch.Tensor) and not v._is_zerotensor() else v
                     for k, v in case.args.items()}  # fmt: skip
        check(case)

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), print_blob=False)  # fmt: skip
    @given(st.data())
    def run(data):
        draw = Draw(data)
        case, value_mutations = BUILDERS[op](draw)
        check(mutate(draw, case, value_mutations, device))

    run()
    return dict(op=op, device=device, seconds=time.perf_counter() - started,
                cpu_seconds=time.process_time() - cpu_started, **counts)  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) >= 3:
        print(json.dumps(fuzz(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "cpu")))
    else:  # the figures docs/ops.md quotes, each op in its own process as under pytest
        total = {"cases": 0, "value_errors": 0, "results": 0, "seconds": 0.0}
        for name, n in EXAMPLES.items():
            command = [sys.executable, __file__, name, str(n)]
            summary = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
            print(_report(summary), flush=True)
            for key in total:
                total[key] += summary[key]
        print(f"all ops: {total['cases']} cases, {total['value_errors']} clean ValueErrors, "
              f"{total['results']} results equal to the reference, 0 crashes, 0 wrong results, "
              f"{total['seconds']:.1f} s of fuzzing")  # fmt: skip
