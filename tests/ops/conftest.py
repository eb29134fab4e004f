"""Fixtures for the op tests: the devices to run on, the CPU instruction sets to cover, the ops
without their native extension (`without_native`), and a hypothesis profile (no deadline: the
first call of a kernel may page in code; derandomized in CI so a run is reproducible)."""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

import orsd.ops
from orsd import _C

settings.register_profile(
    "orsd",
    deadline=None,
    max_examples=50,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# `pytest --hypothesis-profile=orsd-thorough` for a long hunt after changing a kernel.
settings.register_profile("orsd-thorough", parent=settings.get_profile("orsd"), max_examples=1500)
settings.load_profile("orsd")


def _device_params():
    params = [pytest.param(("cpu", isa), id=f"cpu-{isa}") for isa in _C.cpu_isas_available()]
    return params + [pytest.param(("cuda", None), id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=_device_params())
def device(request) -> torch.device:
    """Each op test runs on CPU once per row-math instruction set this machine supports and, where
    CUDA is available, on the GPU (which must then use the native kernels)."""
    kind, isa = request.param
    if kind == "cuda":
        assert orsd.ops.backend()["cuda"] == "native", orsd.ops.backend()
        yield torch.device("cuda")
        return
    previous = _C.cpu_isa()
    _C.set_cpu_isa(isa)
    yield torch.device("cpu")
    _C.set_cpu_isa(previous)


@pytest.fixture(params=_C.cpu_isas_available())
def cpu_isa(request):
    """Runs a CPU-only test once per row-math instruction set this machine supports."""
    previous = _C.cpu_isa()
    _C.set_cpu_isa(request.param)
    yield request.param
    _C.set_cpu_isa(previous)


@pytest.fixture
def without_native(monkeypatch):
    """The op modules as they run when `orsd._C` cannot be imported: the pure-torch reference, its
    once-per-process warning due again."""
    backend = importlib.import_module("orsd.ops._backend")
    monkeypatch.setattr(backend, "_C", None)
    monkeypatch.setattr(backend, "_IMPORT_ERROR", ImportError("simulated"))
    monkeypatch.setattr(backend, "_warned_reference", False)
