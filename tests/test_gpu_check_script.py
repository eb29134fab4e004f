"""benchmarks/gpu_check.sh is run only on a lent GPU, so a rename elsewhere would surface there, in
minutes that are scarce: check here that it parses, that every file it runs exists, and that on a
machine without usable CUDA kernels it stops at once with its own message and status 2."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def expand(path: str) -> list[str]:
    """bash's brace expansion of one `a/{x,y}.py` group (the only form the script uses)."""
    match = re.search(r"\{([^}]*)\}", path)
    if not match:
        return [path]
    return [path[: match.start()] + part + path[match.end():] for part in match.group(1).split(",")]


def test_script_parses_and_names_only_existing_files():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    named = re.findall(r"(?:benchmarks|tests)/[\w{},./-]+", text)
    paths = sorted(set(itertools.chain.from_iterable(expand(p.rstrip(".,)")) for p in named)))
    assert any(p.endswith("bench_lm_head_logprobs.py") for p in paths) and len(paths) >= 8, paths
    missing = [p for p in paths if not p.startswith("benchmarks/results") and not (ROOT / p).exists()]
    assert not missing, missing


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs for minutes: run it there")
def test_without_usable_cuda_kernels_it_stops_with_status_2(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "ORSD_GPU_RESULTS": str(tmp_path), "PYTHON": sys.executable})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "orsd has no usable CUDA kernels here" in result.stdout
    environment = (tmp_path / "environment.txt").read_text()
    assert "'cuda': 'compiled-no-device'" in environment or "'cuda': 'absent'" in environment, environment
