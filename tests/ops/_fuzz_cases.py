"""One builder per op (a valid case, then the op's own value mutations) and the hostile tester's
findings, run before the random cases (tests/ops/_fuzz.py)."""

from __future__ import annotations

from fractions import Fraction

import numpy
import torch
from _fuzz_draw import (HOSTILE_INTS, I64_MAX, I64_MIN, Case, Draw, pack, random_floats, random_ints,
                        random_mask)

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
