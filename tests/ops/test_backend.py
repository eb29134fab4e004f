"""orsd.ops.backend() and the reference fallback when the native module is missing."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

import orsd.ops
from orsd import _C

backend_module = importlib.import_module("orsd.ops._backend")


def test_backend_reports_native_cpu():
    report = orsd.ops.backend()
    assert report["cpu"] == "native"
    assert report["cpu_isa"] == _C.cpu_isa() and report["cpu_isa"] in _C.cpu_isas_available()
    assert report["cuda"] in {"native", "compiled-no-device", "absent"}
    if not _C.cuda_compiled():
        assert report["cuda"] == "absent"
    elif not torch.cuda.is_available():
        assert report["cuda"] == "compiled-no-device"


def test_cuda_probe_never_raises():
    count, code, message = _C.cuda_probe()
    assert count >= 0 and isinstance(code, int) and isinstance(message, str)
    if _C.cuda_compiled() and not torch.cuda.is_available():
        assert count == 0 and code != 0


def test_set_cpu_isa_rejects_unknown_names():
    with pytest.raises(ValueError, match="not compiled in or not supported"):
        _C.set_cpu_isa("avx9000")


def test_reference_fallback_warns_once_and_matches(without_native):
    assert orsd.ops.backend() == {
        "cpu": "absent",
        "cuda": "absent",
        "cpu_isa": "",
        "cuda_detail": "simulated",
    }
    logits = torch.randn(3, 11)
    targets = torch.tensor([1, 2, 10])
    with pytest.warns(RuntimeWarning, match="pure-torch reference"):
        lp = orsd.ops.token_logprobs(logits, targets)
    torch.testing.assert_close(lp, orsd.ops.reference.token_logprobs(logits, targets))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        orsd.ops.microbatch_weights(torch.tensor([True]), torch.tensor([0]), 1)
        new_ids, new_cu, pos_map = orsd.ops.splice_rubric(
            torch.tensor([1, 2]),
            torch.tensor([0, 2]),
            torch.tensor([1]),
            torch.tensor([7]),
            torch.tensor([0, 1]),
            torch.tensor([0]),
        )
    assert new_ids.tolist() == [1, 7, 2] and pos_map.tolist() == [0, 2]


def test_validation_still_runs_without_native(without_native):
    with pytest.raises(ValueError, match="^targets"):
        orsd.ops.token_logprobs(torch.randn(3, 11), torch.tensor([1, 2, 11]))
