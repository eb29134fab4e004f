"""Beyond one machine, on loopback: two `torchrun` "nodes" of one process each, meeting through a c10d
rendezvous on 127.0.0.1 (gloo, DeepSpeed ZeRO-2), train exactly as one node of two processes.

Both launches run tests/train/dist_worker.py (the fully scripted tiny step of test_distributed.py),
so the only difference is how the two ranks found each other: one agent spawning both, or two agents
(`--nnodes 2 --node_rank 0/1`) that each spawn one and agree on ranks through the rendezvous store.
Same tasks per rank, same reductions: the metrics and the weights after the step must agree.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

WORKER = Path(__file__).parent / "dist_worker.py"
#: every process of the test, launchers included, must end within this (a hung rendezvous fails it)
TIMEOUT = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_args(model_dir: Path, out: Path) -> list[str]:
    return [str(WORKER), str(model_dir), str(out), "1", "2"]


def run(commands: list[list[str]]) -> None:
    """Start every command at once (the nodes must meet), wait for all, fail with their stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-4000:]


@pytest.mark.slow
def test_two_nodes_of_one_process_equal_one_node_of_two(tiny_smol_dir, tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run"]
    one_node, two_nodes = tmp_path / "one_node.pt", tmp_path / "two_nodes.pt"
    run([launcher + ["--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                     *worker_args(tiny_smol_dir, one_node)]])
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"orsd-{uuid.uuid4().hex[:8]}"
    run([launcher + ["--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}", "--rdzv_backend=c10d",
                     f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}", "--local_addr=127.0.0.1",
                     "--rdzv_conf=join_timeout=120", *worker_args(tiny_smol_dir, two_nodes)]
         for rank in (0, 1)])
    a, b = torch.load(one_node, weights_only=False), torch.load(two_nodes, weights_only=False)
    assert a["world_size"] == b["world_size"] == 2
    for name, value in a["weights"].items():
        assert torch.allclose(value, b["weights"][name], atol=1e-6, rtol=0), name
    ma, mb = a["metrics"][0], b["metrics"][0]
    compared = same_metrics(ma, mb)
    assert {"loss", "grad_norm", "delta_mean", "reward_mean", "update_tokens"} <= compared
    assert ma["groups_with_bundle"] > 0 and ma["update_tokens"] > 0  # both ranks replayed and updated


def same_metrics(a: dict, b: dict, prefix: str = "") -> set[str]:
    """Every metric equal (floats to 1e-6 relative), nested ones too, except wall-clock figures (the
    verifier's latencies, stage seconds), which no two runs share; returns the names compared."""
    assert set(a) == set(b), prefix
    compared = set()
    for key, value in a.items():
        name = f"{prefix}{key}"
        if "seconds" in key or "latency" in key:
            continue
        if isinstance(value, dict):
            compared |= same_metrics(value, b[key], f"{name}.")
        elif isinstance(value, float):
            assert b[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), name
        else:
            assert b[key] == value, name
        compared.add(name)
    return compared
