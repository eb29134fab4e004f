"""The fuzzer, run in its own process by tests/ops/test_fuzz.py (one op per process, so a segfault
fails one test and shows its case): builds the cases (`_fuzz_cases`, `_fuzz_draw`), calls the op,
and checks each answer against the reference (`expected`, `tolerance`, `compare`).
`python tests/ops/_fuzz.py OP N [DEVICE]` prints one op's summary as JSON."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings

import torch
from _fuzz_cases import BUILDERS, known_cases
from _fuzz_draw import Case, Draw, mutate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orsd.ops
from orsd.ops import reference

#: what a refusal may name: a ValueError's message starts with one of these
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
    print(json.dumps(fuzz(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "cpu")))
