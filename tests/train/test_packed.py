"""engines/packed.py: decode-step matmuls on weights packed once for oneDNN give autocast's results
bit for bit, and every call it does not serve takes the layer's own forward."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import profile

from orsd.engines import decode as decode_module
from orsd.engines.base import Sampling
from orsd.engines.hf import HfEngine
from orsd.engines import packed as packed_module
from orsd.engines.packed import MAX_ROWS, is_packed, packed_linears, packs_bf16

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
# a hardware condition, not a choice: oneDNN refuses to pack bf16 weights on an AVX2-only CPU; there
# test_a_cpu_that_cannot_pack_bf16_... (which runs everywhere) is the case that matters
needs_packing = pytest.mark.skipif(not packs_bf16(), reason="oneDNN packs no bf16 weight on this CPU "
                                   "(needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)")


def packed_calls(prof) -> int:
    return sum(1 for e in prof.events() if e.name == "mkldnn::_linear_pointwise")


def test_a_cpu_that_cannot_pack_bf16_decodes_with_the_layers_own_forward(tiny_model, tiny_tokenizer, monkeypatch):
    """On an AVX2-only CPU oneDNN refuses to pack (packs_bf16() is False there for real; forced here so
    every host checks it): packed_linears packs nothing and decoding under bf16 autocast runs."""
    monkeypatch.setattr(packed_module, "packs_bf16", lambda: False)
    prompts = [tiny_tokenizer.encode(text, add_special_tokens=False) for text in ("the agent clicks", "yes no")]
    engine = HfEngine(tiny_model.eval(), tiny_tokenizer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with packed_linears(tiny_model):
            assert not any(is_packed(m) for m in tiny_model.modules())
        torch.manual_seed(3)
        with profile() as prof:
            generated = engine.generate(prompts, Sampling(temperature=1.0, max_new_tokens=6))
    assert packed_calls(prof) == 0
    assert all(len(g.ids) >= 1 for g in generated)


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel reports them (Linux)."""
    line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    return set(line.split(":", 1)[1].split())


def packs_bf16_in_a_fresh_process(**env: str) -> bool:
    """packs_bf16() in a new interpreter (it is cached per process, and oneDNN reads its ISA cap once)."""
    clean = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    out = subprocess.run([sys.executable, "-c", "from orsd.engines.packed import packs_bf16; print(packs_bf16())"],
                         env={**clean, **env}, capture_output=True, text=True, check=True).stdout
    return {"True": True, "False": False}[out.strip()]


def test_packs_bf16_agrees_with_the_cpus_flags_and_onednns_isa_cap():
    """oneDNN packs bf16 weights with AVX-512 BW/VL/DQ or AVX-NE-CONVERT and refuses otherwise; an
    ISA cap below AVX-512 makes it refuse on any CPU (the capped-Xeon case of docs/performance.md)."""
    flags = cpu_flags()
    expected = {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags
    assert packs_bf16_in_a_fresh_process() is expected
    assert packs_bf16_in_a_fresh_process(ONEDNN_MAX_CPU_ISA="AVX2") is False


@needs_packing
def test_sampled_generation_is_bitwise_the_same_packed_or_not(tiny_model, tiny_tokenizer, monkeypatch):
    prompts = [tiny_tokenizer.encode(text, add_special_tokens=False)
               for text in ("the agent clicks", "Task: put a clean apple in the fridge.", "yes no")]
    engine = HfEngine(tiny_model.eval(), tiny_tokenizer)
    sampling = Sampling(temperature=1.0, max_new_tokens=10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(3)
        with profile() as prof:
            packed = engine.generate(prompts, sampling)
        assert packed_calls(prof) > 0  # the packed path ran
        monkeypatch.setattr(decode_module, "packed_linears", lambda model, rows_hint: contextlib.nullcontext())
        torch.manual_seed(3)
        with profile() as prof:
            plain = engine.generate(prompts, sampling)
        assert packed_calls(prof) == 0
    assert [g.ids for g in packed] == [g.ids for g in plain]
    assert [g.logprobs for g in packed] == [g.logprobs for g in plain]
    assert sum(len(g.ids) for g in plain) > len(prompts)  # several decode steps were compared
    assert not any(is_packed(m) for m in tiny_model.modules())  # forwards restored on exit


@needs_packing
def test_few_rows_take_the_packed_weight_and_match_autocast_bitwise():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96, bias=False)  # fp32, requires grad: the trainable layers' case
    frozen = torch.nn.Linear(96, 32, bias=False).to(torch.bfloat16).requires_grad_(False)
    model = torch.nn.Sequential(layer, frozen)
    x = torch.randn(2, 3, 64)  # 6 rows
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
        with packed_linears(model, rows_hint=6):
            assert is_packed(layer) and is_packed(frozen)
            with profile() as prof:
                got = model(x)
            assert packed_calls(prof) == 2
    assert got.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(got, expected)
    assert not is_packed(layer) and not is_packed(frozen)


def test_calls_it_does_not_serve_take_the_layers_own_forward():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96, bias=False)
    many = torch.randn(MAX_ROWS + 1, 64)
    few = torch.randn(4, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), packed_linears(layer):
        with profile() as prof:
            with torch.no_grad():
                layer(many)  # too many rows
            out = layer(few)  # a gradient is wanted
        assert packed_calls(prof) == 0
        out.float().sum().backward()
    assert few.grad is not None and layer.weight.grad is not None
    with packed_linears(layer):  # no autocast: nothing is packed
        assert not is_packed(layer)
    with torch.autocast("cpu", dtype=torch.bfloat16), packed_linears(layer, rows_hint=MAX_ROWS + 1):
        assert not is_packed(layer)  # a batch of more rows than it serves: no packing at all


@needs_packing
def test_biased_zero3_placeholder_and_hooked_layers_are_left_alone():
    biased = torch.nn.Linear(8, 8)
    placeholder = torch.nn.Linear(8, 8, bias=False)
    placeholder.weight.ds_id = 0  # what DeepSpeed ZeRO-3 marks a partitioned parameter with
    hooked = torch.nn.Linear(8, 8, bias=False)
    hook = hooked.forward = lambda x: x  # as accelerate's offloading sets a forward on the instance
    plain = torch.nn.Linear(8, 8, bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16), packed_linears(torch.nn.Sequential(biased, placeholder, hooked, plain)):
        assert not is_packed(biased) and not is_packed(placeholder) and not is_packed(hooked)
        assert is_packed(plain)
    assert hooked.forward is hook
