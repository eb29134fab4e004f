"""benchmarks/gpu_train_check.sh runs on a lent GPU only in minutes that are scarce, so its CPU mode
runs here the same code path end to end (a tiny random model, the carried-tokenizer option a lease
uses, DeepSpeed ZeRO-2 on one gloo rank, the FLOP counter) and its JSON is checked: every part ran,
every stage of both methods has a finite time, the ratio and the counted FLOPs are there."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_train_check.sh"
STAGES = ("advantages", "bundles", "verifier", "align", "replay", "teacher", "reference", "update")
#: stages that forward records in every method: their time cannot be zero
FORWARDING = ("replay", "reference", "update")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    pytest.importorskip("deepspeed")
    from orsd.train.model import load_tokenizer

    tmp = tmp_path_factory.mktemp("gpu_train_check")
    load_tokenizer("smollm2-135m").save_pretrained(tmp / "tokenizer")  # what --prepare carries to a lease
    done = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--out", str(tmp / "out"),
                           "--tokenizer", str(tmp / "tokenizer")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OMP_NUM_THREADS": "2"})
    return done, tmp / "out"


@pytest.mark.slow
def test_cpu_mode_runs_every_part(cpu_run):
    done, out = cpu_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "train_check.json").read_text())
    assert result["errors"] == {} and result["parts_skipped"] == {}
    assert result["parts_done"] == ["matmul_ceiling", "build", "rollout", "step_1_grpo", "step_2_orsd",
                                    "step_3_orsd", "step_4_grpo", "deepspeed_zero2", "flops"]
    assert result["build"]["parameters"] > 0 and result["build"]["seconds"] > 0
    assert "orsd-shape-" in result["shape"]["model"]  # the --tokenizer copy of the shape file
    rollout = result["rollout"]
    assert rollout["seconds"] > 0 and rollout["response_tokens"] > 0 and rollout["records"] >= rollout["trajectories"] == 8
    assert rollout["decode_tokens_per_second"] > 0
    steps = {k: v for k, v in result.items() if k.startswith("step_")}
    for name, step in steps.items():
        assert set(step["seconds"]) >= set(STAGES), name
        assert all(math.isfinite(v) and v >= 0 for v in step["seconds"].values()), (name, step["seconds"])
        assert all(step["seconds"][k] > 0 for k in FORWARDING), (name, step["seconds"])
        assert all(v > 0 for v in step["record_tokens_per_second"].values()), name
        assert math.isfinite(step["metrics"]["loss"]) and step["metrics"]["grad_norm"] > 0, name
    # the ORSD-shaped step (static_rubric) ran the rubric pass: Δ is computed, GRPO has none
    assert all(math.isfinite(steps[k]["metrics"]["delta_mean"]) for k in steps if k.endswith("orsd"))
    ratio = result["ratio"]
    assert 0.5 < ratio["orsd_over_grpo_after_rollout"] < 10 and 0.5 < ratio["orsd_over_grpo_second_steps"] < 10
    ds = result["deepspeed_zero2"]
    assert ds["backend"] == "gloo"
    for method in ("grpo", "orsd"):
        assert ds[method]["seconds"]["update"] > 0 and math.isfinite(ds[method]["metrics"]["loss"])
        assert ds[method]["update_over_plain_torch"] > 0
        flops = result["flops"][method]
        assert flops["flops"]["update"] > flops["flops"]["reference"] > 0
        assert 0 < flops["mfu_measured"] < 1.5, flops  # against the fp32 matmul measured in the same run
    # the rubric pass forwards more than GRPO's plain pass alone
    assert result["flops"]["orsd"]["flops"]["replay"] > result["flops"]["grpo"]["flops"]["replay"]
    table = (out / "train_check.md").read_text()
    assert "ORSD/GRPO after the rollout" in table and "DeepSpeed" in table and "FAILED" not in table


def test_script_parses_and_its_lease_call_carries_the_prepared_folder():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    call = re.search(r'run\(command="bash benchmarks/gpu_train_check.sh[^)]*carry=\["([^"]+)"\]', text)
    assert call and call.group(1) == "build/gpu_carry" and 'CARRY=build/gpu_carry' in text
    # the carried folder must stay ignored by git (only ignored paths are carried on purpose)
    ignored = subprocess.run(["git", "check-ignore", "-q", "build/gpu_carry/wheels/x.whl"], cwd=ROOT)
    assert ignored.returncode == 0


def test_cuda_mode_without_a_gpu_stops_with_its_own_message(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the check itself runs there")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_train_check.py"), "--device", "cuda",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "torch sees no CUDA device" in done.stderr
