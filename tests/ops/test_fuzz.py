"""Hostile-input fuzzing of every op (issue 12): whatever hypothesis throws at an op, the answer is
either the reference's (orsd/ops/reference.py, within the op's tolerance) or a ValueError whose
message starts with the name of one of the op's arguments. Never a crash, never another
exception, never a different number.

Cases start from a valid input (random shapes, dtypes, values with NaN/inf, masks, tensors at a
storage offset) and most then get one mutation: a layout the kernels cannot read (non-contiguous,
transposed, stride 0, negative-bit view, ZeroTensor, freed storage, sparse, meta, a list), a wrong
dtype or rank, hostile numbers (INT64_MAX/MIN, 2^40 ids, unsorted or wrapping offsets, subnormal
or huge temperatures, 10**400), or a wrong length. An unmutated case must not be refused.

Each op is fuzzed in its own subprocess (tests/ops/_fuzz.py run as a script; its cases come from
_fuzz_cases.py and _fuzz_draw.py), so a segfault is a failed test that shows the case being run,
not a dead pytest. Hypothesis runs derandomized without a database: every run tries the same
cases. `python tests/ops/test_fuzz.py` prints the figures for all ops;
`python tests/ops/test_fuzz.py OP N [DEVICE]` fuzzes one op with N examples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

EXAMPLES = {
    "token_logprobs": 1000,
    "fused_token_logprobs": 800,
    "grpo_advantages": 1000,
    "splice_rubric": 1000,
    "shape_advantages": 1000,
    "microbatch_weights": 1000,
}

#: the fuzzer, run as a script: one op per process
FUZZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fuzz.py")


# ---- pytest side: one subprocess per op ----------------------------------------------------------


def run_fuzz(op: str, examples: int, device: str = "cpu") -> dict:
    """Fuzz `op` in a subprocess; returns its summary or fails the test with the case it died on."""
    with tempfile.TemporaryDirectory() as scratch:
        last_case = os.path.join(scratch, "last_case.txt")
        env = dict(os.environ, ORSD_FUZZ_LAST_CASE=last_case)
        proc = subprocess.run(
            [sys.executable, FUZZER, op, str(examples), device],
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


def check_summary(summary: dict, examples: int) -> None:
    """What both devices' runs must show: every case ran, and both outcomes were exercised, or the
    mutations (or the valid cases) have gone dead. A crash or a wrong number already failed the
    run (run_fuzz)."""
    assert summary["cases"] >= examples, summary
    assert summary["value_errors"] > examples // 5, summary
    assert summary["results"] > examples // 5, summary


@pytest.mark.parametrize("op", list(EXAMPLES))
def test_fuzz_op_gives_the_reference_or_a_value_error(op):
    summary = run_fuzz(op, EXAMPLES[op])
    print(_report(summary))
    check_summary(summary, EXAMPLES[op])


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(EXAMPLES))
def test_fuzz_op_on_cuda(op):
    summary = run_fuzz(op, EXAMPLES[op] // 4, "cuda")
    print(_report(summary))
    check_summary(summary, EXAMPLES[op] // 4)


if __name__ == "__main__":
    if len(sys.argv) >= 3:  # one op, its summary as JSON
        sys.exit(subprocess.run([sys.executable, FUZZER, *sys.argv[1:4]]).returncode)
    # the figures docs/ops.md quotes, each op in its own process as under pytest
    total = {"cases": 0, "value_errors": 0, "results": 0, "seconds": 0.0}
    for name, n in EXAMPLES.items():
        command = [sys.executable, FUZZER, name, str(n)]
        summary = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
        print(_report(summary), flush=True)
        for key in total:
            total[key] += summary[key]
    print(f"all ops: {total['cases']} cases, {total['value_errors']} clean ValueErrors, "
          f"{total['results']} results equal to the reference, 0 crashes, 0 wrong results, "
          f"{total['seconds']:.1f} s of fuzzing")  # fmt: skip
