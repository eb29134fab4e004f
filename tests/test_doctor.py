"""orsd-doctor: runs as a program, names the backend, passes the self-check of every op on CPU
(exit code 0) and lists the versions a bug report needs."""

from __future__ import annotations

import re
import subprocess
import sys

import orsd.ops
from orsd.ops.selfcheck import OPS


def test_doctor_reports_backend_every_op_and_versions():
    proc = subprocess.run(
        [sys.executable, "-m", "orsd.doctor"], capture_output=True, text=True, timeout=300
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    backend = orsd.ops.backend()
    assert f"backend: cpu={backend['cpu']} cuda={backend['cuda']}" in out
    assert "self-check on cpu" in out
    for op in OPS:
        assert re.search(rf"^\s+{op}\s+ok\s", out, re.MULTILINE), f"{op} not ok:\n{out}"
    for name in ("python", "torch", "transformers", "vllm", "deepspeed", "orsd", "gcc"):
        assert re.search(rf"^\s+{name}\s+\S", out, re.MULTILINE), f"no {name} version:\n{out}"
    assert "result: all self-checks passed" in out


def test_doctor_exits_1_when_a_self_check_fails(monkeypatch, capsys):
    import orsd.doctor

    def failing(device, ops=None, *, strict=False):
        return {op: {"ok": op != "splice_rubric", "max_error": 0.0, "detail": "stub"} for op in OPS}

    monkeypatch.setattr(orsd.ops, "self_check", failing)
    assert orsd.doctor.main() == 1
    out = capsys.readouterr().out
    assert re.search(r"^\s+splice_rubric\s+FAIL\s", out, re.MULTILINE)
    assert "a self-check FAILED" in out
