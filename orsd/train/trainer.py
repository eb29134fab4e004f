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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from orsd.engines.hf import HfEngine, Sampling
from orsd.envs.prompts import prompt_templates
from orsd.methods import Advantages, BundleRequest, Method, make_method

from . import bundles
from . import delta as deltas
from . import lora, overlap, warmstart
from .checkpoint import kill_point
from .config import Config
from .distributed import deepspeed_backward, gathered
from .forward import replay_logprobs
from .loss import UpdateSpec, update
from .metrics import combine, values
from .model import autocast, release_memory, trim_heap
from .optim import build_optimizer, warmup_schedule
from .records import Group
from .replay import PlainReplay, ReplayResult, ReplaySpec, paired_replay, plain_replay
from .rollout import rollout
from .step_records import StepOutputs, group_records, step_metrics
from .teacher import DistillTerm, Teacher, teacher_pass


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
        self.config = config
        self.method = method or make_method(config)  # build.py passes the one it built
        self.dist, self.ds_engine = dist, ds_engine
        if ds_engine is not None:  # forwards go to the module; DeepSpeed owns backward and step
            policy, optimizer = ds_engine.module, ds_engine.optimizer
        self.policy = policy
        self.tokenizer = tokenizer
        self.reference = reference
        self.verifier = verifier
        self.env = env
        self.engine = engine or HfEngine(policy, tokenizer, config.rollout.batch_size,
                                         draft_corpus=warmstart.draft_corpus(config, tokenizer))
        self.optimizer = optimizer or build_optimizer(policy.parameters(), config.optim)
        self.scheduler = (ds_engine.lr_scheduler if ds_engine is not None
                          else warmup_schedule(self.optimizer, config.optim.warmup_steps))
        self.world_size, self.rank = (dist.world_size, dist.rank) if dist else (1, 0)
        self.templates = prompt_templates(config.env.name, config.env.prompt)
        self.initial_engine = None  # generation with the frozen initial policy (offline rubrics)
        self.task_rng = random.Random(config.train.seed)
        self.step_index = 0
        self.environment: dict = {}  # what build decided (self-check, precision) for environment.json
        self.backward = self.optimizer_step = None
        if ds_engine is not None:
            self.backward = lambda loss, last: deepspeed_backward(ds_engine, loss, last)
            self.optimizer_step = lambda: (ds_engine.step(), float(ds_engine.get_global_grad_norm() or 0.0))[1]
        # collectives that keep ranks in step: micro-batch counts always, forwards under ZeRO-3
        self.lockstep = dist.max_int if dist else None
        self.replay_lockstep = dist.max_int if dist and dist.zero_stage == 3 else None
        self._reference_shares: dict[int, bool | None] = {}  # reference_shares_frozen, per split
        self.base_path = config.model.path  # what model.lora's adapters adapt (build sets a warm start's)

    # -- Algorithm 1 -----------------------------------------------------------------------------
    def step(self, groups: list[Group] | None = None) -> StepResult:
        """One step; `groups` replaces the rollout (benchmarks compare methods on the same batch)."""
        cfg, method, seconds = self.config, self.method, {}
        seed_everything(cfg.train.seed, self.step_index)
        stage = self.stage_timer(seconds)
        with stage("rollout"):  # N trajectories per task, rewards by Eq. 12/13 as each episode ends
            groups = self.rollout(self.sample_tasks()) if groups is None else groups
        with stage("advantages"):  # Eq. 2 (a method may add per-turn terms)
            advantages = method.advantages(groups)
        with stage("bundles"):  # M bundles per group by the policy, never shown the rewards (§3.1)
            request = method.bundle_request(groups)
            written, plain = self.bundles_beside_plain(request, groups)  # plain: None where it did not run
            candidates = method.candidates(groups, request, written)
        with stage("verifier"):  # every criterion on every trajectory, in [0, 1]
            scores = (bundles.verify(self.verifier, groups, candidates, cfg.rubric.transcript_chars)
                      if method.calls_verifier else [None] * len(groups))
        with stage("align"):  # Eq. 5–7: B* by Spearman ρ (or an ablation's choice)
            selection = (bundles.select(groups, candidates, scores, method.selection, self.selection_rng(),
                                        cfg.rubric.min_rho)
                         if method.writes_bundles else [None] * len(groups))
        with stage("replay"):  # Eq. 8–9: Δ = lp_with − lp_without (or − lp_control), A = A_GRPO + α·e·Δ
            rubrics = [method.rubric_for(g, c, s) for g, c, s in zip(groups, candidates, selection)]
            controls = deltas.control_bundles(cfg.rubric.delta_baseline, candidates, selection, rubrics,
                                              cfg.train.seed, self.step_index)
            replay = self.paired_replay(groups, advantages, rubrics, plain, controls)
        with stage("teacher"):  # OPSD family: the privileged teacher on the same response tokens
            teacher = (self.teacher(groups, advantages, candidates, scores, selection, replay)
                       if method.distillation else None)
        with stage("reference"):
            reference = self.reference_logprobs(replay)
        kill_point("update", self.step_index + 1)
        with timed(seconds, "update"):  # Eq. 11 reduced by Eq. 14; autocasts forwards only
            update_metrics = self.update(replay, reference, teacher)
        replay.frozen_states = None  # nothing after the update reads them; a kept StepResult would hold them
        with timed(seconds, "sync"):
            self.engine.sync_weights(self.policy)  # the rollout engine samples from the new weights
        self.step_index += 1
        outputs = StepOutputs(advantages, candidates, scores, selection, replay, teacher, controls)
        records = group_records(groups, outputs, self.tokenizer)
        metrics = {**step_metrics(groups, outputs, self.step_index, method.alpha, method.step_metrics(groups),
                                  self.counters()),
                   **update_metrics}
        if self.dist is None:
            return StepResult(groups, records, values(metrics), seconds, outputs)
        per_rank = self.dist.gather((records, metrics))  # rank 0 writes every rank's records
        return StepResult(groups, [r for rank_records, _ in per_rank for r in rank_records],
                          combine([m for _, m in per_rank]), seconds, outputs)

    # -- stages ----------------------------------------------------------------------------------
    def stage_timer(self, seconds: dict):
        """A no-grad stage: timed, and in mixed precision when model.autocast is set."""

        @contextmanager
        def stage(name: str):
            kill_point(name, self.step_index + 1)  # a test hook (checkpoint.kill_point)
            with timed(seconds, name), autocast(self.policy, self.config.model.autocast):
                yield
            trim_heap()  # its KV caches and hidden states had sizes the next stage will not ask for

        return stage

    def sample_tasks(self) -> list:
        """This rank's share of the step's `tasks_per_step` tasks. Every rank draws the same tasks
        from the same seeded sampler (its position is part of the checkpoint) and keeps its slice."""
        count, pool = self.config.rollout.tasks_per_step, self.task_pool()
        tasks = [self.env.sample_task(self.task_rng) if pool is None else pool[self.task_rng.randrange(len(pool))]
                 for _ in range(count)]
        return tasks[self.group_offset:self.group_offset + count // self.world_size]

    def task_pool(self) -> list | None:
        """env.train_tasks tasks of the training split (Env.task_pool: the same for every seed and
        method), or None when the run samples the whole split (the paper)."""
        size = self.config.env.train_tasks
        return self.env.task_pool(size) if size else None

    @property
    def group_offset(self) -> int:
        return self.rank * (self.config.rollout.tasks_per_step // self.world_size)

    def rollout(self, tasks: list) -> list[Group]:
        cfg, r = self.config, self.config.rollout
        return rollout(self.engine, self.tokenizer, self.env, tasks, r.group_size,
                       Sampling(r.temperature, r.top_p, r.max_new_tokens, top_k=r.top_k), r.max_context_tokens,
                       cfg.env.max_actions, cfg.env.max_history_turns, f"s{self.step_index}", self.group_offset,
                       self.templates, cfg.rubric.placement)

    def write_bundles(self, request: BundleRequest | None, engine: HfEngine | None = None) -> list:
        """One Candidates per group of `request`, by the current policy or (writer="initial") the
        frozen initial one, through `engine` when given (a twin's: bundles_beside_plain)."""
        if request is None:
            return []
        r = self.config.rubric
        return bundles.write_bundles(engine or self.bundle_engine(request.writer), self.tokenizer, request.groups,
                                     request.count, bundles.sampling(r), r.transcript_chars,
                                     r.generation_template or None)

    def bundles_beside_plain(self, request: BundleRequest | None, groups: list[Group]) -> tuple[list, PlainReplay | None]:
        """The bundles `request` asks for and, with replay.overlap where it serves (overlap.serves)
        and the method writes bundles, the plain pass: beside the bundles on a thread of its own
        when there are any to write, else alone on all threads. The plain pass is None where it did
        not run here (paired_replay runs it)."""
        if not self.overlaps():
            return self.write_bundles(request), None
        if request is None or not request.groups:
            return [], self.plain_pass(groups)
        return overlap.write_beside_plain(lambda twin: self.write_bundles(request, twin),
                                          self.bundle_engine(request.writer), lambda: self.plain_pass(groups),
                                          lambda: autocast(self.policy, self.config.model.autocast))

    def bundle_engine(self, writer: str) -> HfEngine:
        if writer == "initial" and self.initial_engine is None:
            self.initial_engine = HfEngine(self.reference, self.tokenizer, self.config.rollout.batch_size,
                                           draft_corpus=warmstart.draft_corpus(self.config, self.tokenizer))
        return self.initial_engine if writer == "initial" else self.engine

    def overlaps(self) -> bool:
        """Whether this step writes bundles beside the plain pass: replay.overlap where it serves."""
        return (self.config.replay.overlap and self.method.writes_bundles
                and overlap.serves(self.engine, self.policy, self.dist is not None))

    def selection_rng(self) -> np.random.Generator:
        return np.random.default_rng((self.config.train.seed, self.step_index))

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
        """Per record: its turn advantage and the ids of its group's rubric message and control (None
        where the group has none or they do not fit the context budget: e = 0 there; delta.replay_inputs).
        `plain`: the plain pass when it already ran (plain_pass)."""
        inputs = deltas.replay_inputs(self.tokenizer, self.config, groups, advantages, rubrics, controls)
        return paired_replay(self.policy, inputs.records, inputs.advantages, inputs.rubrics, self.method.alpha,
                             self.replay_spec, plain=plain, record_controls=inputs.controls, record_keep=inputs.keep,
                             plain_logprobs=self.reads_plain_logprobs())

    def reads_plain_logprobs(self) -> bool:
        """Whether anything after the replay reads the plain pass's log-probs even where no record
        has a rubric: π_old of the ratio (optim.old_logprobs=replay) or the teacher's gap metric."""
        return self.config.optim.old_logprobs == "replay" or self.method.distillation is not None

    def reference_logprobs(self, replay: ReplayResult | PlainReplay) -> torch.Tensor:
        if not self.config.optim.kl_coef:  # the KL term is multiplied by 0: any finite values serve
            return replay.old_logprobs if replay.old_logprobs is not None else replay.rollout_logprobs
        p, states = replay.packed, replay.frozen_states
        if states is not None and not self.reference_shares_frozen(states[0]):
            states = None
        return replay_logprobs(self.reference, p.ids, p.cu_seqlens, p.response_mask,
                               self.config.rollout.temperature, self.config.replay.token_budget,
                               self.config.replay.fused,  # the reference is a plain full copy per rank
                               share_prefix=self.config.replay.share_prefix, frozen_states=states)

    def reference_shares_frozen(self, split: int) -> bool:
        """Whether the reference's embeddings and bottom `split` layers hold the policy's frozen
        values (they were copied from it and neither trains), so the plain pass's states of those
        layers are the reference's too. Compared once per split."""
        known = self._reference_shares.setdefault(split, None)
        if known is None:
            mine, theirs = self.policy, self.reference
            pairs = [(mine.get_input_embeddings(), theirs.get_input_embeddings()),
                     *zip(mine.get_decoder().layers[:split], theirs.get_decoder().layers[:split])]
            known = self._reference_shares[split] = all(
                a.dtype == b.dtype and torch.equal(a, b)
                for x, y in pairs for a, b in zip(x.state_dict().values(), y.state_dict().values()))
        return known

    def teacher(self, groups: list[Group], advantages: Advantages, candidates: list, scores: list, selection: list,
                replay: ReplayResult) -> Teacher:
        """The method's privileged text per turn, spliced at the rubric slot like B* (a turn whose
        context would exceed the budget gets no teacher, as ORSD's e = 0), forwarded without grad
        by π_old (the policy before this update) or the frozen reference."""
        cfg, method = self.config, self.method
        contexts = method.teacher_contexts(groups, advantages, candidates, scores, selection, self.step_index)
        records, privileged, coef, ids_of = [], [], [], {}
        for group, texts, group_coef in zip(groups, contexts.texts, contexts.coef):
            for trajectory, turn_texts in zip(group.trajectories, texts):
                for record, text in zip(trajectory.records, turn_texts):
                    if text is not None and text not in ids_of:
                        ids_of[text] = bundles.rubric_ids(self.tokenizer, text, cfg.rubric.context_role)
                    ids = ids_of[text] if text is not None else None
                    fits = (ids is not None and record.rubric_slot >= 0
                            and record.num_tokens + len(ids) <= cfg.rollout.max_context_tokens)
                    records.append(record)
                    privileged.append(ids if fits else None)
                    coef.append(group_coef)
        rollout_teacher = method.distillation.teacher == "rollout"
        spec = dataclasses.replace(self.replay_spec, lockstep=self.replay_lockstep if rollout_teacher else None)
        teacher = teacher_pass(self.policy if rollout_teacher else self.reference, replay.packed, records, privileged,
                               coef, method.distillation, spec)
        taught = teacher.weight > 0
        gap = (teacher.logprobs - replay.old_logprobs)[taught]
        teacher.metrics = {**contexts.metrics,
                           "teacher_token_fraction": (float(taught[replay.packed.response_mask].float().mean())
                                                      if replay.packed.response_mask.any() else 0.0, "tokens"),
                           "teacher_gap_mean": (float(gap.mean()) if len(gap) else 0.0, "tokens"),
                           "teacher_stored_bytes": (teacher.stored_bytes, "sum")}
        return teacher

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

    def counters(self) -> dict:
        """This step's accounting kept outside the stages' results: speculative bundle decoding
        (the engines' draft counts; the overlap twin shares its engine's) and the verifier's calls.
        Reading them resets them."""
        out = {}
        if self.config.rubric.draft_tokens and isinstance(self.engine, HfEngine):
            drafts = self.engine.take_draft_stats()
            if self.initial_engine is not None:
                drafts.add(self.initial_engine.take_draft_stats())
            out["drafts"] = drafts
        if self.verifier is not None and hasattr(self.verifier, "stats"):
            out["verifier"] = self.verifier.stats(reset=True)
        return out

    def save_policy(self, path) -> None:
        """An HF-loadable copy of the current policy (with model.lora: its adapters in peft's format,
        on `self.base_path`); under ZeRO-3 all ranks gather, rank 0 writes."""
        if lora.enabled(self.config.model.lora):  # ZeRO-2 at most: every rank holds the adapters whole
            if self.rank == 0:
                lora.save_adapters(self.policy, self.config.model.lora, self.base_path, path)
            return
        with gathered(*self.policy.parameters()) if self.dist and self.dist.zero_stage == 3 else nullcontext():
            if self.rank == 0:
                self.policy.save_pretrained(path)


@contextmanager
def timed(seconds: dict, name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
