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
from safetensors.torch import load_file

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
def test_lora_adapters_train_under_zero2_on_two_ranks_as_on_one(tiny_smol_dir, tmp_path):
    """model.lora under ZeRO-2 (gloo, 2 ranks): the adapters move as on one process, the base does not."""
    single, double = tmp_path / "single.pt", tmp_path / "double.pt"
    args = ["model.lora.rank=4", "optim.train_layers=0"]
    run_worker([str(tiny_smol_dir), str(single), "1", "2", *args], 1, 0)
    run_worker([str(tiny_smol_dir), str(double), "1", "2", *args], 2, 29561)
    a, b = torch.load(single, weights_only=False), torch.load(double, weights_only=False)
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert a["weights"].keys() == b["weights"].keys()
    for name, value in a["weights"].items():
        assert torch.allclose(value, b["weights"][name], atol=1e-4, rtol=0), name
    initial = load_file(next(tiny_smol_dir.glob("*.safetensors")))
    base = {name: value for name, value in a["weights"].items() if "lora_" not in name}
    assert all(torch.equal(value, initial[name.replace(".base_layer", "")].to(value.dtype))
               for name, value in base.items() if name.replace(".base_layer", "") in initial)
    assert any("lora_B" in name and value.abs().max() > 0 for name, value in a["weights"].items())
    ma, mb = a["metrics"][0], b["metrics"][0]
    assert ma["kl"] == mb["kl"] == 0.0  # B = 0 before the first update: the policy is its base
    for key in ("loss", "pg_loss", "delta_mean", "grad_norm"):
        assert ma[key] == pytest.approx(mb[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage,train_layers", [(2, 0), (3, 0), (2, 1)])
def test_two_ranks_equal_one(zero_stage, train_layers, tiny_smol_dir, tmp_path):
    """(2, 1): optim.train_layers=1 of 2, the lower layer frozen under ZeRO-2 too."""
    single, double = tmp_path / "single.pt", tmp_path / "double.pt"
    args = [f"optim.train_layers={train_layers}"]
    run_worker([str(tiny_smol_dir), str(single), "1", str(zero_stage), *args], 1, 0)
    run_worker([str(tiny_smol_dir), str(double), "1", str(zero_stage), *args], 2, 29500 + zero_stage * 7 + train_layers)
    a, b = torch.load(single, weights_only=False), torch.load(double, weights_only=False)
    assert (a["world_size"], b["world_size"]) == (1, 2)
    for name, value in a["weights"].items():
        assert torch.allclose(value, b["weights"][name], atol=1e-4, rtol=0), name
    initial = load_file(next(tiny_smol_dir.glob("*.safetensors")))
    moved = {name for name, value in a["weights"].items()
             if name in initial and not torch.equal(value, initial[name].to(value.dtype))}
    top_only = all(name.startswith(("model.layers.1.", "model.norm.")) for name in moved)
    assert moved and top_only == bool(train_layers)  # frozen: only the top layer and the final norm moved
    ma, mb = a["metrics"][0], b["metrics"][0]
    for key in ("reward_mean", "response_tokens", "update_tokens", "groups_with_bundle", "bundles_parsed"):
        assert ma[key] == mb[key], key
    for key in ("loss", "pg_loss", "delta_mean", "advantage_abs_mean", "grad_norm", "entropy"):
        assert ma[key] == pytest.approx(mb[key], rel=1e-4, abs=1e-6), key
    assert ma["groups_with_bundle"] > 0  # the rubric path was exercised on both ranks
