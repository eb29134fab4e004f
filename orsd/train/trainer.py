"""The training step, top to bottom as the paper's Algorithm 1; every stage returns its result.

tasks → N rollouts per task with rewards (Eq. 12/13) → GRPO advantages (Eq. 2) → M bundles by the
current policy → verifier scores → selection of B* (Eq. 5–7) → paired replay: Δ (Eq. 8) and the
shaped advantage (Eq. 9) → reference log-probs → PPO-clip + k3 KL update (Eq. 11), token-mean per
micro-batch (Eq. 14) → records. What differs between GRPO, ORSD and the other methods is decided
by one method object (orsd.methods), built once from the config.
"""

from __future__ import annotations

import dataclasses
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from orsd.engines.hf import HfEngine
from orsd.methods import Advantages, Method, make_method

from . import bundles
from . import delta as deltas
from . import overlap, warmstart
from .checkpoint import kill_point
from .config import Config
from .distributed import deepspeed_hooks
from .loss import UpdateSpec, update
from .metrics import combine, values
from .model import autocast, release_memory, save_policy, trim_heap
from .optim import build_optimizer, warmup_schedule
from .records import Group
from .reference import ReferencePass
from .replay import PlainReplay, ReplayResult, ReplaySpec, paired_replay, plain_replay
from .rollout import Episodes, rollout, sample_tasks
from .step_records import StepOutputs, counters, group_records, step_metrics
from .teacher import DistillTerm, Teacher, privileged_turns, teacher_pass, with_metrics


def seed_everything(seed: int, step: int) -> None:
    """Every step reseeds from (seed, step): a resumed run samples exactly what an unbroken one did."""
    mixed = (seed * 1_000_003 + step) % (2**31)
    random.seed(mixed)
    np.random.seed(mixed)
    torch.manual_seed(mixed)


@dataclass
class StepResult:
    groups: list[Group]
    records: list[dict]  # one groups.jsonl line per group (all ranks' under distribution)
    metrics: dict
    seconds: dict = field(default_factory=dict)
    outputs: StepOutputs | None = None  # this rank's stage results


class Trainer:
    """Holds the policy, its frozen reference, the engines, the env and the method; `step()` is
    Algorithm 1."""

    def __init__(self, config: Config, policy, tokenizer, reference, verifier, env, engine=None,
                 optimizer=None, dist=None, ds_engine=None, method: Method | None = None):
        """Size: the run's parts as build.py made them; those after `env` are optional so that tests hand in
        their own."""
        self.config = config
        self.method = method or make_method(config)  # build.py passes the one it built
        self.dist, self.ds_engine = dist, ds_engine
        if ds_engine is not None:  # forwards go to the module; DeepSpeed owns backward and step
            policy, optimizer = ds_engine.module, ds_engine.optimizer
        self.policy, self.tokenizer, self.reference, self.verifier, self.env = policy, tokenizer, reference, verifier, env
        self.engine = engine or HfEngine(policy, tokenizer, config.rollout.batch_size,
                                         draft_corpus=warmstart.draft_corpus(config, tokenizer))
        self.writer = bundles.BundleWriter(  # the frozen initial policy writes offline rubrics
            self.engine, lambda: HfEngine(reference, tokenizer, config.rollout.batch_size,
                                          draft_corpus=warmstart.draft_corpus(config, tokenizer)),
            tokenizer, config.rubric)
        self.reference_pass = ReferencePass(reference, policy, config)
        self.optimizer = optimizer or build_optimizer(policy.parameters(), config.optim)
        self.scheduler = (ds_engine.lr_scheduler if ds_engine is not None
                          else warmup_schedule(self.optimizer, config.optim.warmup_steps))
        self.world_size, self.rank = (dist.world_size, dist.rank) if dist else (1, 0)
        self.group_offset = self.rank * (config.rollout.tasks_per_step // self.world_size)  # this rank's first group
        self.episodes = Episodes.from_config(config)  # how the rollout plays each task's N episodes
        self.task_rng = random.Random(config.train.seed)
        self.step_index = 0
        self.environment: dict = {}  # what build decided (self-check, precision) for environment.json
        self.backward, self.optimizer_step = deepspeed_hooks(ds_engine)
        # collectives that keep ranks in step: micro-batch counts always, forwards under ZeRO-3
        self.lockstep = dist.max_int if dist else None
        self.replay_lockstep = dist.max_int if dist and dist.zero_stage == 3 else None
        self.base_path = config.model.path  # what model.lora's adapters adapt (build sets a warm start's)

    # -- Algorithm 1 -----------------------------------------------------------------------------
    def step(self, groups: list[Group] | None = None) -> StepResult:
        """One step; `groups` replaces the rollout (benchmarks compare methods on the same batch)."""
        cfg, method, seconds = self.config, self.method, {}
        seed_everything(cfg.train.seed, self.step_index)
        stage = stage_timer(seconds, self.step_index + 1, self.policy, cfg.model.autocast)
        with stage("rollout"):  # N trajectories per task, rewards by Eq. 12/13 as each episode ends
            groups = self.rollout(self.sample_tasks()) if groups is None else groups
        with stage("advantages"):  # Eq. 2 (a method may add per-turn terms)
            advantages = method.advantages(groups)
        # the plain pass (π_old's contexts) needs no bundle: with replay.overlap it runs beside the writer
        plain = overlap.Later(lambda: self.plain_pass(groups)) if self.overlaps() else None
        with stage("bundles"):  # M bundles per group by the policy, never shown the rewards (§3.1)
            request = method.bundle_request(groups)
            written = self.writer.write(request, plain, lambda: autocast(self.policy, cfg.model.autocast))
            candidates = method.candidates(groups, request, written)
        with stage("verifier"):  # every criterion on every trajectory, in [0, 1]
            scores = (bundles.verify(self.verifier, groups, candidates, cfg.rubric.transcript_chars)
                      if method.calls_verifier else [None] * len(groups))
        with stage("align"):  # Eq. 5–7: B* by Spearman ρ (or an ablation's choice)
            rng = np.random.default_rng((cfg.train.seed, self.step_index))  # the random-bundle ablation's
            selection = (bundles.select(groups, candidates, scores, method.selection, rng, cfg.rubric.min_rho)
                         if method.writes_bundles else [None] * len(groups))
        with stage("replay"):  # Eq. 8–9: Δ = lp_with − lp_without (or − lp_control), A = A_GRPO + α·e·Δ
            rubrics = [method.rubric_for(g, c, s) for g, c, s in zip(groups, candidates, selection)]
            controls = deltas.control_bundles(cfg.rubric.delta_baseline, candidates, selection, rubrics,
                                              cfg.train.seed, self.step_index)
            replay = self.paired_replay(groups, advantages, rubrics, plain.value() if plain else None, controls)
        with stage("teacher"):  # OPSD family: the privileged teacher on the same response tokens
            teacher = (self.teacher(groups, advantages, candidates, scores, selection, replay)
                       if method.distillation else None)
        with stage("reference"):
            reference = self.reference_pass.logprobs(replay, replay.frozen_states)
        kill_point("update", self.step_index + 1)
        with timed(seconds, "update"):  # Eq. 11 reduced by Eq. 14; autocasts forwards only
            update_metrics = self.update(replay, reference, teacher)
        with timed(seconds, "sync"):
            self.engine.sync_weights(self.policy)  # the rollout engine samples from the new weights
        self.step_index += 1
        kept = dataclasses.replace(replay, frozen_states=None)  # a kept StepResult need not hold the layer states
        outputs = StepOutputs(advantages, candidates, scores, selection, kept, teacher, controls)
        records = group_records(groups, outputs, self.tokenizer)
        metrics = {**step_metrics(groups, outputs, self.step_index, method.alpha, method.step_metrics(groups),
                                  counters(self.writer if cfg.rubric.draft_tokens else None, self.verifier)),
                   **update_metrics}
        if self.dist is None:
            return StepResult(groups, records, values(metrics), seconds, outputs)
        per_rank = self.dist.gather((records, metrics))  # rank 0 writes every rank's records
        return StepResult(groups, [r for rank_records, _ in per_rank for r in rank_records],
                          combine([m for _, m in per_rank]), seconds, outputs)

    # -- stages ----------------------------------------------------------------------------------
    def sample_tasks(self) -> list:
        """This rank's share of the step's tasks: every rank draws the same from the same seeded
        sampler (its position is checkpointed) and keeps its slice."""
        tasks = sample_tasks(self.env, self.task_rng, self.config.rollout.tasks_per_step, self.config.env.train_tasks)
        return tasks[self.group_offset:self.group_offset + len(tasks) // self.world_size]

    def rollout(self, tasks: list) -> list[Group]:
        return rollout(self.engine, self.tokenizer, self.env, tasks, self.episodes, f"s{self.step_index}",
                       self.group_offset)

    def overlaps(self) -> bool:
        """Whether this step writes bundles beside the plain pass: replay.overlap where it serves."""
        return (self.config.replay.overlap and self.method.writes_bundles
                and overlap.serves(self.engine, self.policy, self.dist is not None))

    @property
    def replay_spec(self) -> ReplaySpec:
        """How this run's no-grad passes run (read from the config each time: benchmarks change it)."""
        return ReplaySpec.from_config(self.config, self.replay_lockstep, reuse_frozen=self.ds_engine is None)

    def plain_pass(self, groups: list[Group]) -> PlainReplay:
        """The plain-context replay of every record, in paired_replay's order."""
        records = [r for g in groups for t in g.trajectories for r in t.records]
        return plain_replay(self.policy, records, self.replay_spec,
                            keep_prefixes=self.config.replay.reuse_plain and self.method.writes_bundles)

    def paired_replay(self, groups: list[Group], advantages: Advantages, rubrics: list,
                      plain: PlainReplay | None = None, controls: list | None = None) -> ReplayResult:
        """Per record: its turn advantage and its group's rubric and control ids (delta.replay_inputs);
        `plain`: the plain pass when it already ran."""
        inputs = deltas.replay_inputs(self.tokenizer, self.config, groups, advantages, rubrics, controls)
        return paired_replay(self.policy, inputs.records, inputs.advantages, inputs.rubrics, self.method.alpha,
                             self.replay_spec, plain=plain, record_controls=inputs.controls, record_keep=inputs.keep,
                             plain_logprobs=self.reads_plain_logprobs())

    def reads_plain_logprobs(self) -> bool:
        """Whether anything after the replay reads the plain pass's log-probs even where no record
        has a rubric: π_old of the ratio (optim.old_logprobs=replay) or the teacher's gap metric."""
        return self.config.optim.old_logprobs == "replay" or self.method.distillation is not None

    def teacher(self, groups: list[Group], advantages: Advantages, candidates: list, scores: list, selection: list,
                replay: ReplayResult) -> Teacher:
        """The method's privileged text per turn spliced at the rubric slot like B*, forwarded without
        grad by π_old (the policy before this update) or the frozen reference."""
        cfg, distillation = self.config, self.method.distillation
        contexts = self.method.teacher_contexts(groups, advantages, candidates, scores, selection, self.step_index)
        records, privileged, coef = privileged_turns(groups, contexts.texts, contexts.coef, self.tokenizer,
                                                     cfg.rubric.context_role, cfg.rollout.max_context_tokens)
        by_policy = distillation.teacher == "rollout"
        spec = dataclasses.replace(self.replay_spec, lockstep=self.replay_lockstep if by_policy else None)
        return with_metrics(teacher_pass(self.policy if by_policy else self.reference, replay.packed, records,
                                         privileged, coef, distillation, spec), replay, contexts.metrics)

    def update(self, replay: ReplayResult, reference: torch.Tensor, teacher: Teacher | None = None) -> dict:
        o, p = self.config.optim, replay.packed
        if p.num_sequences == 0 and self.dist is None:
            return {}
        old = replay.old_logprobs if o.old_logprobs == "replay" else replay.rollout_logprobs
        distill = (DistillTerm(self.method.distillation, teacher, self.config.rollout.temperature)
                   if teacher is not None else None)
        spec = UpdateSpec.from_config(self.config, share_prefix=self.replay_lockstep is None)  # ZeRO-3: equal forwards
        metrics = update(self.policy, self.optimizer, p, old, reference, replay.advantages, spec,
                         lockstep=self.lockstep, backward=self.backward, step=self.optimizer_step,
                         scheduler=None if self.ds_engine is not None else self.scheduler, distill=distill,
                         frozen_states=replay.frozen_states)  # its layers are still the frozen ones replayed
        release_memory()  # the micro-batches' activations are freed: their pages go back before the next rollout
        return metrics

    def save_policy(self, path) -> None:
        """An HF-loadable copy of the current policy (model.save_policy)."""
        save_policy(self.policy, path, self.config.model.lora, self.base_path, self.rank,
                    zero3=self.dist is not None and self.dist.zero_stage == 3)


def stage_timer(seconds: dict, step: int, policy, autocast_name: str):
    """A no-grad stage of step `step` (numbered from 1): timed into `seconds`, and in mixed precision
    when model.autocast (`autocast_name`) is set."""

    @contextmanager
    def stage(name: str):
        kill_point(name, step)  # a test hook (checkpoint.kill_point)
        with timed(seconds, name), autocast(policy, autocast_name):
            yield
        trim_heap()  # its KV caches and hidden states had sizes the next stage will not ask for

    return stage


@contextmanager
def timed(seconds: dict, name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
