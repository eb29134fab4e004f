"""benchmarks/step.py's ratios: ORSD/GRPO excluding the verifier, and the same with the stages both
methods run at GRPO's times."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")


@pytest.fixture
def step(monkeypatch):
    # importing step.py sets OMP_WAIT_POLICY for later processes (as orsd-train does); keep this
    # process's environment as it was
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.syspath_prepend(BENCHMARKS)
    return importlib.import_module("step")


def test_ratios_exclude_the_verifier_and_can_put_shared_stages_at_grpo_times(step):
    grpo = {"advantages": 0.0, "bundles": 0.0, "verifier": 0.0, "replay": 4.0, "reference": 2.0, "update": 10.0}
    orsd = {"advantages": 0.0, "bundles": 7.0, "verifier": 3.5, "replay": 3.0, "reference": 3.0, "update": 9.0}
    r = step.ratios(grpo, orsd, rollout_seconds=10.0)
    assert r["ratio_after_rollout_excluding_verifier"] == pytest.approx(22.0 / 16.0)
    assert r["ratio_step_excluding_verifier"] == pytest.approx(32.0 / 26.0)
    # the shared stages take 12 s in both steps here (ORSD 3 + 9, GRPO 2 + 10): both measures agree
    assert r["ratio_after_rollout_shared_as_grpo"] == pytest.approx(22.0 / 16.0)
    assert r["ratio_step_shared_as_grpo"] == pytest.approx(32.0 / 26.0)
    orsd["update"] = 12.0  # a slower shared stage moves the plain ratio, not the shared-as-GRPO one
    r = step.ratios(grpo, orsd, rollout_seconds=10.0)
    assert r["ratio_step_excluding_verifier"] == pytest.approx(35.0 / 26.0)
    assert r["ratio_step_shared_as_grpo"] == pytest.approx(32.0 / 26.0)


def test_table_prints_both_ratios(step):
    grpo = {"advantages": 0.0, "replay": 4.0, "reference": 2.0, "update": 10.0}
    orsd = {"advantages": 0.0, "bundles": 7.0, "verifier": 3.5, "replay": 3.0, "reference": 2.0, "update": 12.0}
    result = {"rollout_seconds": 10.0, "grpo_seconds": grpo, "orsd_seconds": orsd, "records": 3, "response_tokens": 30,
              "context_tokens": 300, "groups_with_bundle": 1.0, "order": "grpo orsd orsd grpo", "complete": True,
              "machine": {"cpu": "cpu", "isa": ["avx2"], "torch_threads": 2, "load_average_1_5_15": [0.1, 0.1, 0.1]},
              "load_average_after": [0.2, 0.2, 0.2], "grpo_cpu_seconds": 30.0, "orsd_cpu_seconds": 40.0,
              **step.ratios(grpo, orsd, 10.0)}
    table = step.format_table(result)
    assert "whole step 1.31, after the rollout 1.50 (target <= 1.25)" in table
    assert "at GRPO's times: 1.23, 1.38" in table
