"""A 2-process DeepSpeed run (gloo, CPU) equals the single-process step within tolerance.

Both run the same fully scripted rollouts (a test fake engine, so sampling is identical), the real
local verifier, paired replay and the update; each record is its own micro-batch and every rank
holds the same number of records, so Eq. 14 with D·G micro-batches is the same quantity in both.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

WORKER = Path(__file__).parent / "dist_worker.py"


def run_worker(args, world_size, port):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if world_size == 1:
        command = [sys.executable, str(WORKER), *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world_size}",
                   f"--master_port={port}", str(WORKER), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_two_ranks_equal_one(zero_stage, tiny_smol_dir, tmp_path):
    single, double = tmp_path / "single.pt", tmp_path / "double.pt"
    run_worker([str(tiny_smol_dir), str(single), "1", str(zero_stage)], 1, 0)
    run_worker([str(tiny_smol_dir), str(double), "1", str(zero_stage)], 2, 29500 + zero_stage * 7)
    a, b = torch.load(single, weights_only=False), torch.load(double, weights_only=False)
    assert (a["world_size"], b["world_size"]) == (1, 2)
    for name, value in a["weights"].items():
        assert torch.allclose(value, b["weights"][name], atol=1e-4, rtol=0), name
    ma, mb = a["metrics"][0], b["metrics"][0]
    for key in ("reward_mean", "response_tokens", "update_tokens", "groups_with_bundle", "bundles_parsed"):
        assert ma[key] == mb[key], key
    for key in ("loss", "pg_loss", "delta_mean", "advantage_abs_mean", "grad_norm", "entropy"):
        assert ma[key] == pytest.approx(mb[key], rel=1e-4, abs=1e-6), key
    assert ma["groups_with_bundle"] > 0  # the rubric path was exercised on both ranks
