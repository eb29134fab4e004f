"""LoRA (model.lora): low-rank adapters on the policy through peft, the reference for free.

The adapters are peft's own: `peft.inject_adapter_in_model` puts its `lora.Linear` layers into the
policy in place, so the policy stays the transformers model every other room reads (its decoder,
layers and head where they were) and trains only the adapters. The reference policy and the local
verifier are the base model: `base_view` builds, before the adapters go in, a second module tree
whose parameters and buffers ARE the policy's tensors (no copy of any weight), and the adapters are
then added to the policy's tree only. That is the policy with its adapters switched off, as peft's
`disable_adapter()` gives, without a switch on shared modules: the bundle writer and the plain pass
run on two threads at once (replay.overlap), and a flag flipped by one would change the other.

Checkpoints hold the adapters in peft's format (adapter_config.json and adapter_model.safetensors,
loadable with `PeftModel.from_pretrained(base, path)`); `attach` puts them back on their base
(model.load_policy does, for any adapter directory), and `merged` gives the base with them merged
(`orsd-export`, train/cli.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config.rules import ConfigError

#: peft's name for the one adapter orsd trains
ADAPTER = "default"
#: peft's name for "every linear layer but the output head", which an adapter_config.json may hold
ALL_LINEAR = "all-linear"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: the key prefix PeftModel.save_pretrained writes (PeftModel -> LoraModel -> the transformers model)
PEFT_PREFIX = "base_model.model."


class LoraError(ConfigError):
    """A model.lora setting that cannot be applied to this model (known only once it is loaded); the
    message names the key and what is allowed, and orsd-train reports it as a config error (exit 2)."""


def enabled(lora_config) -> bool:
    return lora_config.rank > 0


def peft_config(lora_config, targets: list[str], layers: list[int] | None = None):
    """peft's LoraConfig for `targets` (linear layer names); `layers`: the decoder layers that get
    adapters (None: all)."""
    from peft import LoraConfig

    where = {} if layers is None else {"layers_to_transform": list(layers), "layers_pattern": "layers"}
    return LoraConfig(r=lora_config.rank, lora_alpha=lora_config.alpha, lora_dropout=lora_config.dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM", **where)


def adapted_layers(model, top: int) -> list[int] | None:
    """optim.train_layers=top: the top `top` decoder layers get adapters, the ones below stay frozen
    (and their states are reused, as in full training); 0 or >= the layer count: all (None)."""
    count = len(model.get_decoder().layers)
    return None if not top or top >= count else list(range(count - top, count))


def base_view(model):
    """A frozen, eval-mode module tree over the very tensors of `model` (parameters and buffers are
    shared, modules are not): the base the adapters will be added to, seen without them. Call it
    before `inject`."""
    from .overlap import twin

    view = twin(model)
    view.eval()
    for parameter in view.parameters():
        parameter.requires_grad_(False)
    return view


def linear_names(model) -> list[str]:
    """The last name component of every linear layer under the decoder (what target_modules may name)."""
    decoder = model.get_decoder()
    return sorted({name.rsplit(".", 1)[-1] for name, module in decoder.named_modules()
                   if isinstance(module, torch.nn.Linear)})


def inject(model, lora_config, top: int = 0) -> int:
    """Add peft's LoRA layers to `model` in place (to the top `top` decoder layers only, when given:
    optim.train_layers); every other parameter stops training. Returns the number of trainable
    (adapter) parameters. Bad settings raise LoraError naming the key."""
    from peft import inject_adapter_in_model

    if not hasattr(model, "get_decoder") or not linear_names(model):
        raise LoraError(f"model.lora.rank={lora_config.rank}: {type(model).__name__} has no decoder of "
                        "linear layers peft can adapt; expected a transformers causal LM (or model.lora.rank=0)",
                        key="model.lora.rank")
    known = linear_names(model)
    unknown = [t for t in lora_config.target_modules if t not in known]
    if unknown:
        raise LoraError(f"model.lora.target_modules: {unknown} name no linear layer of {type(model).__name__}; "
                        f"expected a list of {known} ([] = all of them)", key="model.lora.target_modules")
    try:
        # [] = every linear layer of the decoder by name (peft's all-linear, which layers_to_transform refuses)
        targets = list(lora_config.target_modules) or known
        inject_adapter_in_model(peft_config(lora_config, targets, adapted_layers(model, top)), model,
                                adapter_name=ADAPTER)
    except ValueError as error:  # peft's own refusal, e.g. a module type it cannot wrap
        raise LoraError(f"model.lora.rank={lora_config.rank}: peft cannot adapt {type(model).__name__} "
                        f"({error}); expected a model peft supports or model.lora.rank=0", key="model.lora.rank") from None
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in name)
        if "lora_" in name and parameter.dtype in (torch.bfloat16, torch.float16):
            # f32 master weights for the adapters, as peft's get_peft_model keeps them (its
            # autocast_adapter_dtype): in bf16 an update of lr·~1 on an entry of ~0.01 is below half its
            # spacing and rounds away, and AdamW's moments would be bf16 too. The base keeps its dtype;
            # peft's layer casts its input to the adapter's dtype (under autocast the matmul is bf16 anyway)
            parameter.data = parameter.data.float()
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapters' tensors under the keys peft's PeftModel saves and loads."""
    from peft import get_peft_model_state_dict

    return {PEFT_PREFIX + key: value.detach().cpu().contiguous()
            for key, value in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()}


def save_adapters(model, lora_config, base_path: str, directory: Path) -> None:
    """adapter_config.json and adapter_model.safetensors in peft's format; `base_path` is the base
    model they adapt (model.path, or the warm start's checkpoints/reference)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    adapted = [name.split(".lora_A")[0] for name, _ in model.named_parameters() if "lora_A" in name]
    config = peft_config(lora_config, sorted({name.rsplit(".", 1)[-1] for name in adapted}),
                         sorted({int(name.split("layers.")[1].split(".")[0]) for name in adapted}))
    config.base_model_name_or_path = str(base_path)
    config.save_pretrained(str(directory))
    save_file(adapter_state(model), str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def load_adapters(model, directory: Path) -> None:
    """Set the adapters of an injected `model` from a directory save_adapters (or peft) wrote."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(directory) / ADAPTER_WEIGHTS))
    state = {key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key: value for key, value in state.items()}
    result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise LoraError(f"{directory}: the adapters do not fit the model (missing {missing[:3]}, unexpected "
                        f"{list(result.unexpected_keys)[:3]})")


def is_adapter_dir(path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def saved_settings(directory) -> dict:
    """rank, alpha, dropout, target_modules and the base of an adapter directory."""
    raw = json.loads((Path(directory) / ADAPTER_CONFIG).read_text())
    targets = raw.get("target_modules")
    return {"rank": raw["r"], "alpha": raw["lora_alpha"], "dropout": raw.get("lora_dropout", 0.0),
            "target_modules": [] if targets in (ALL_LINEAR, None) else sorted(targets),
            "layers": raw.get("layers_to_transform"), "base": raw.get("base_model_name_or_path")}


def attach(model, directory) -> None:
    """Inject the adapters an adapter directory describes into its base `model` (loaded by the
    caller from saved_settings(directory)["base"]) and load their weights, trainable as in training."""
    from types import SimpleNamespace

    settings = saved_settings(directory)
    layers = settings["layers"]
    count = len(model.get_decoder().layers)
    top = count - min(layers) if layers and sorted(layers) == list(range(min(layers), count)) else 0
    if layers and not top:
        raise LoraError(f"{directory}: adapters on layers {layers}, not a top block of the {count} layers orsd adapts")
    inject(model, SimpleNamespace(**{k: settings[k] for k in ("rank", "alpha", "dropout", "target_modules")}), top)
    load_adapters(model, directory)


def merged(base, adapter_dir):
    """`base` (the model adapter_dir's adapters adapt) with them merged into its weights: peft's
    merge_and_unload, a plain transformers model again."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def save_merged(model, directory) -> None:
    """The adapted `model` saved as a plain HF checkpoint of its base architecture, every LoRA weight
    merged (engines/weight_sync.named_tensors, what each weight push sends): the vllm engine starts
    from it."""
    from orsd.engines.weight_sync import named_tensors

    model.save_pretrained(directory, state_dict={name: t.detach().contiguous() for name, t in named_tensors(model)})
