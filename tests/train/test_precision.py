"""model.autocast=auto (bf16 only where the device runs it well, else fp32) and model.threads."""

import json
import os
import subprocess
import sys
import math

import pytest
import torch

from orsd.train import precision as precision_module
from orsd.train.config import ConfigError, load_config
from orsd.train.model import autocast
from orsd.train.precision import choose_autocast, probe_bf16_speedup

SHAPE = dict(hidden_size=576, intermediate_size=1536)  # SmolLM2-135M's MLP


def never_probe():
    raise AssertionError("the probe must not run when the flags or the config already decide")


@pytest.fixture
def uncapped(monkeypatch):
    """No oneDNN instruction-set cap in the environment (the shell running the tests may set one)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    return monkeypatch


@pytest.mark.parametrize("flags", [{"avx512f", "avx512_bf16"}, {"avx2", "amx_tile", "amx_bf16"}])
def test_cpu_with_native_bf16_gets_bf16_without_a_probe(uncapped, flags):
    choice = choose_autocast("auto", "cpu", torch.float32, **SHAPE, flags=flags, probe=never_probe)
    assert choice.autocast == "bfloat16"
    assert "natively" in choice.reason and any(flag in choice.reason for flag in flags)
    assert choice.probe_speedup is None


@pytest.mark.parametrize("name", ["ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"])
@pytest.mark.parametrize("speedup, expected", [(0.01, ""), (2.0, "bfloat16")])
def test_native_flags_with_onednn_capped_are_measured_not_trusted(uncapped, name, speedup, expected):
    """Capped, oneDNN may emulate bf16 on a CPU that has it: the flags no longer decide, the probe does."""
    uncapped.setenv(name, "AVX2")
    choice = choose_autocast("auto", "cpu", torch.float32, **SHAPE, flags={"avx512_bf16", "amx_bf16"},
                             probe=lambda: speedup)
    assert choice.autocast == expected and choice.probe_speedup == speedup
    assert f"{name}=AVX2" in choice.reason and "amx_bf16" in choice.reason and f"{speedup:.2f}x" in choice.reason


def test_onednn_capped_to_avx2_gets_fp32_from_the_real_probe():
    """A fresh process (oneDNN reads the cap once) with the cap at AVX2: bf16 is emulated on every
    x86 CPU then, with or without the bf16 flags, and `auto` must measure that and keep fp32."""
    code = ("import torch; from orsd.train.precision import choose_autocast\n"
            "choice = choose_autocast('auto', 'cpu', torch.float32, hidden_size=576, intermediate_size=1536)\n"
            "print(repr(choice.autocast), choice.probe_speedup, choice.reason)\n")
    env = {k: v for k, v in os.environ.items() if k != "DNNL_MAX_CPU_ISA"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**env, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert done.returncode == 0, done.stderr
    autocast_value, speedup, reason = done.stdout.split(" ", 2)
    assert autocast_value == "''", done.stdout
    assert float(speedup) < 1.0 and "probe" in reason


def test_cpu_without_native_bf16_where_the_probe_finds_it_slower_gets_fp32():
    # the issue-13 machine: AVX2 only, bf16 33x slower than fp32
    choice = choose_autocast("auto", "cpu", torch.float32, **SHAPE, flags={"avx2", "fma"}, probe=lambda: 0.03)
    assert choice.autocast == ""
    assert choice.probe_speedup == 0.03
    assert "0.03x" in choice.reason and "fp32" in choice.reason


def test_cpu_without_native_bf16_where_the_probe_finds_it_faster_gets_bf16():
    choice = choose_autocast("auto", "cpu", torch.float32, **SHAPE, flags={"avx2"}, probe=lambda: 1.6)
    assert choice.autocast == "bfloat16"
    assert choice.probe_speedup == 1.6 and "1.60x" in choice.reason


def test_a_probe_just_above_parity_is_not_enough():
    """The matmul is not the whole model and autocast adds casts: bf16 must win clearly."""
    choice = choose_autocast("auto", "cpu", torch.float32, **SHAPE, flags=set(), probe=lambda: 1.05)
    assert choice.autocast == ""


@pytest.mark.parametrize("requested", ["", "bfloat16", "float16"])
def test_an_explicit_setting_is_kept(requested):
    choice = choose_autocast(requested, "cpu", torch.float32, **SHAPE, flags={"avx2"}, probe=never_probe)
    assert (choice.requested, choice.autocast) == (requested, requested)


def test_weights_already_in_bf16_get_no_autocast():
    choice = choose_autocast("auto", "cpu", torch.bfloat16, **SHAPE, flags={"avx512_bf16"}, probe=never_probe)
    assert choice.autocast == "" and "bfloat16" in choice.reason


@pytest.mark.parametrize("supported, expected", [(True, "bfloat16"), (False, "")])
def test_cuda_follows_the_devices_bf16_support(monkeypatch, supported, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Fake GPU")
    choice = choose_autocast("auto", "cuda:0", torch.float32, **SHAPE, flags=set(), probe=never_probe)
    assert choice.autocast == expected and "Fake GPU" in choice.reason


def test_probe_measures_a_positive_ratio():
    assert 0 < probe_bf16_speedup(64, 128, rows=16, budget_seconds=0.2) < math.inf


def test_probe_stops_after_one_slow_bf16_call():
    """With no budget left the first bf16 call decides (an emulated bf16 call may take seconds)."""
    calls = []
    real = torch.nn.functional.linear

    def counting(*args, **kwargs):
        calls.append(torch.is_autocast_enabled("cpu"))
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "linear", counting)
        assert probe_bf16_speedup(64, 128, rows=16, budget_seconds=0.0) > 0
    assert calls.count(True) == 1


def test_auto_is_resolved_once_per_model_shape(monkeypatch, tiny_model):
    monkeypatch.setattr(precision_module, "_RESOLVED", {})
    probes = []
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(precision_module, "probe_bf16_speedup", lambda *a, **k: probes.append(a) or 0.5)
    for _ in range(3):
        with autocast(tiny_model, "auto"):
            assert not torch.is_autocast_enabled("cpu")  # the probe said fp32
    assert len(probes) == 1
    monkeypatch.setattr(precision_module, "cpu_flags", lambda: {"avx512_bf16"})
    monkeypatch.setattr(precision_module, "_RESOLVED", {})
    with autocast(tiny_model, "auto"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_threads_key_sets_torchs_threads_and_zero_keeps_the_default():
    # in a fresh process: torch's thread count is process state that other tests in the suite change
    code = ("import torch; from orsd.train.precision import configure_threads\n"
            "assert configure_threads(1).count == 1 == torch.get_num_threads()\n"
            "assert configure_threads(0).count == 1  # 0 leaves whatever is set (no quota lowers 1)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_threads_setup_bounds_onednns_primitive_cache_unless_the_user_set_it():
    # fresh processes: the variable is read once per process, and the test must not leave it set
    code = ("import os; from orsd.train.precision import ONEDNN_CACHE_CAPACITY, configure_threads\n"
            "configure_threads(0)\n"
            "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], ONEDNN_CACHE_CAPACITY)\n")
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    value, default = done.stdout.split()
    assert value == default and 0 < int(value) < 1024  # bounded below oneDNN's own 1,024
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**env, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "7"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "7"


def test_config_accepts_auto_and_threads_and_names_bad_values():
    config = load_config(None, ["model.autocast=auto", "model.threads=2"])
    assert (config.model.autocast, config.model.threads) == ("auto", 2)
    assert load_config().model.autocast == "auto"  # the embedded default measures, never assumes
    with pytest.raises(ConfigError, match="model.threads"):
        load_config(None, ["model.threads=-1"])
    with pytest.raises(ConfigError, match="model.autocast"):
        load_config(None, ["model.autocast=fast"])


def test_the_run_says_what_it_chose_and_records_it(tiny_smol_dir, tmp_path):
    # in a fresh process (torch's thread count is process state other tests change); the CPU is
    # faked as AVX2-only with a probe that finds bf16 4x slower
    code = """
import json, sys
from pathlib import Path
from orsd.train import precision as precision_module
from orsd.train.cli import run
from orsd.train.config import load_config
precision_module.cpu_flags = lambda: {"avx2"}
precision_module.probe_bf16_speedup = lambda *a, **k: 0.25
model_dir, out = sys.argv[1], Path(sys.argv[2])
lines = []
config = load_config(None, [f"model.path={model_dir}", "model.device=cpu", "model.autocast=auto",
                            "model.threads=1", "train.steps=0", "warm_start.enabled=false",
                            "train.progress=false", "train.report=false", "train.tensorboard=false"])
run(config, str(out / "run"), log=lines.append)
import torch
print(json.dumps({"lines": lines, "threads": torch.get_num_threads()}))
"""
    done = subprocess.run([sys.executable, "-c", code, str(tiny_smol_dir), str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    said = [line for line in result["lines"] if line.startswith("precision:")]
    assert len(said) == 1 and "-> fp32" in said[0] and "0.25x" in said[0] and "1 CPU threads" in said[0]
    recorded = json.loads((tmp_path / "run" / "environment.json").read_text())
    assert recorded["precision"] == {"requested": "auto", "autocast": "", "probe_speedup": 0.25,
                                     "reason": recorded["precision"]["reason"], "threads": 1,
                                     "threads_reason": "model.threads"}
    assert "0.25x" in recorded["precision"]["reason"]
    assert result["threads"] == recorded["torch_threads"] == 1


def test_bf16_asked_for_on_a_cpu_without_it_is_kept_and_said_to_be_emulated():
    asked = choose_autocast("bfloat16", "cpu", torch.float32, **SHAPE, flags={"avx2", "fma"}, probe=never_probe)
    assert asked.autocast == "bfloat16" and "emulated" in asked.reason and "set in the config" in asked.reason
    native = choose_autocast("bfloat16", "cpu", torch.float32, **SHAPE, flags={"avx512_bf16"}, probe=never_probe)
    assert native.autocast == "bfloat16" and "emulated" not in native.reason
    assert "emulated" not in choose_autocast("", "cpu", torch.float32, **SHAPE, flags={"avx2"}).reason
