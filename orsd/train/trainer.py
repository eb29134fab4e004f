"""The ORSD training step, top to bottom as the paper's Algorithm 1.

sample tasks → N rollouts per task → rewards (Eq. 12/13) → GRPO advantages (Eq. 8) → M bundles
by the current policy → verifier → alignment (Eq. 5–7) → paired replay (Δ, Eq. 9–10) → PPO-clip
update with k3 KL, token-mean per micro-batch (Eq. 11, 14) → records. GRPO and the ablations are
the same step with switches (`rubric.mode`).
"""

from __future__ import annotations

import random
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from orsd import envs, ops, rubric
from orsd.envs.prompts import prompt_templates

from . import bundles as rubric_stage
from .config import Config
from .distributed import combine_metrics, deepspeed_backward, gathered
from .engines import HfEngine, Sampling
from .loss import update
from .model import autocast
from .records import Group
from .replay import paired_replay, replay_logprobs
from .rollout import rollout


def seed_everything(seed: int, step: int) -> None:
    """Every step reseeds from (seed, step): a resumed run samples exactly what an unbroken one did."""
    mixed = (seed * 1_000_003 + step) % (2**31)
    random.seed(mixed)
    np.random.seed(mixed)
    torch.manual_seed(mixed)


@dataclass
class StepResult:
    groups: list[Group]
    metrics: dict
    seconds: dict = field(default_factory=dict)


class Trainer:
    """Holds the policy, its frozen reference, the engines and the env; `step()` is Algorithm 1."""

    def __init__(self, config: Config, policy, tokenizer, reference, verifier, env, engine=None,
                 optimizer=None, dist=None, ds_engine=None):
        self.config = config
        self.dist, self.ds_engine = dist, ds_engine
        if ds_engine is not None:  # forwards go to the module; DeepSpeed owns backward and step
            policy, optimizer = ds_engine.module, ds_engine.optimizer
        self.policy = policy
        self.tokenizer = tokenizer
        self.reference = reference
        self.verifier = verifier
        self.env = env
        self.engine = engine or HfEngine(policy, tokenizer, config.rollout.batch_size)
        self.optimizer = optimizer or torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad], lr=config.optim.lr,
            betas=tuple(config.optim.betas), weight_decay=config.optim.weight_decay)
        self.scheduler = (ds_engine.lr_scheduler if ds_engine is not None
                          else warmup_schedule(self.optimizer, config.optim.warmup_steps))
        self.world_size, self.rank = (dist.world_size, dist.rank) if dist else (1, 0)
        self.templates = prompt_templates(config.env.name, config.env.prompt)
        self.offline_bundles: dict[str, object] = {}  # offline_rubric: task id -> bundle, kept
        self.initial_engine = None  # offline_rubric: generation with the frozen initial policy
        self.task_rng = random.Random(config.train.seed)
        self.step_index = 0
        self.backward = self.optimizer_step = None
        if ds_engine is not None:
            self.backward = lambda loss, last: deepspeed_backward(ds_engine, loss, last)
            self.optimizer_step = lambda: (ds_engine.step(), float(ds_engine.get_global_grad_norm() or 0.0))[1]
        # collectives that keep ranks in step: micro-batch counts always, forwards under ZeRO-3
        self.lockstep = dist.max_int if dist else None
        self.replay_lockstep = dist.max_int if dist and dist.zero_stage == 3 else None

    # -- Algorithm 1 -----------------------------------------------------------------------------
    def step(self) -> StepResult:
        cfg, seconds = self.config, {}
        seed_everything(cfg.train.seed, self.step_index)
        stage = self.stage_timer(seconds)
        with stage("rollout"):
            tasks = self.sample_tasks()
            groups = rollout(self.engine, self.tokenizer, self.env, tasks, cfg.rollout.group_size,
                             self.rollout_sampling(), cfg.rollout.max_context_tokens, cfg.env.max_actions,
                             cfg.env.max_history_turns, f"s{self.step_index}", self.group_offset,
                             self.templates)
            # rewards (Eq. 12/13) are set per trajectory as its episode ends
        with stage("advantages"):
            self.grpo_advantages(groups)
        if cfg.uses_rubrics:
            with stage("bundles"):
                candidates = self.generate_bundles(groups)
            with stage("verifier"):
                self.verify(candidates)
            with stage("align"):
                self.align(candidates)
        with stage("replay"):
            replay = self.paired_replay(groups)
        with stage("reference"):
            reference = self.reference_logprobs(replay)
        with timed(seconds, "update"):  # autocasts its forwards only, never backward or step
            update_metrics = self.update(replay, reference)
        with timed(seconds, "sync"):
            self.engine.sync_weights(self.policy)  # the rollout engine samples from the new weights
        self.step_index += 1
        metrics = self.metrics(groups, replay, update_metrics)
        if self.dist is not None:  # every rank's groups and metrics, for rank 0's records
            per_rank = self.dist.gather((groups, metrics))
            groups = [g for rank_groups, _ in per_rank for g in rank_groups]
            metrics = combine_metrics([m for _, m in per_rank])
        return StepResult(groups, metrics, seconds)

    # -- stages ----------------------------------------------------------------------------------
    def stage_timer(self, seconds: dict):
        """A no-grad stage: timed, and in mixed precision when model.autocast is set."""

        @contextmanager
        def stage(name: str):
            with timed(seconds, name), autocast(self.policy, self.config.model.autocast):
                yield

        return stage

    def sample_tasks(self) -> list:
        """This rank's share of the step's `tasks_per_step` tasks. Every rank draws the same tasks
        from the same seeded sampler (its position is part of the checkpoint) and keeps its slice."""
        count = self.config.rollout.tasks_per_step
        tasks = [self.env.sample_task(self.task_rng) for _ in range(count)]
        return tasks[self.group_offset:self.group_offset + count // self.world_size]

    @property
    def group_offset(self) -> int:
        return self.rank * (self.config.rollout.tasks_per_step // self.world_size)

    def rollout_sampling(self) -> Sampling:
        r = self.config.rollout
        return Sampling(r.temperature, r.top_p, r.max_new_tokens)

    def grpo_advantages(self, groups: list[Group]) -> None:
        """Eq. 8: (r − mean) / (std + ε) within each group, one value per trajectory."""
        rewards = torch.tensor([t.reward for g in groups for t in g.trajectories], dtype=torch.float32)
        group_ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.trajectories], dtype=torch.long)
        advantages = ops.grpo_advantages(rewards, group_ids, self.config.optim.adv_eps,
                                         self.config.optim.norm_adv_by_std).tolist()
        for trajectory, advantage in zip((t for g in groups for t in g.trajectories), advantages):
            trajectory.advantage = advantage

    def generate_bundles(self, groups: list[Group]) -> list[Group]:
        """M bundles per group by the current policy (never shown rewards). Returns the groups that
        go on to selection; in `orsd` mode a group whose rewards are all equal is skipped, since no
        bundle can correlate with constant rewards (ρ undefined) — it saves generation and verifier
        calls without changing any result."""
        r, mode = self.config.rubric, self.config.rubric.mode
        sampling = Sampling(r.temperature, r.top_p, r.max_new_tokens, no_repeat_ngram_size=r.no_repeat_ngram_size)
        template = r.generation_template or None
        if mode == "offline_rubric":
            fresh = [g for g in groups if g.task.id not in self.offline_bundles]
            if self.initial_engine is None:  # the initial policy writes offline bundles
                self.initial_engine = HfEngine(self.reference, self.tokenizer, self.config.rollout.batch_size)
            unique = list({g.task.id: g for g in fresh}.values())
            rubric_stage.generate_bundles(self.initial_engine, self.tokenizer, unique, 1, sampling,
                                          r.transcript_chars, template)
            for g in unique:
                self.offline_bundles[g.task.id] = g.bundles[0] if g.bundles else None
            for g in groups:
                kept = self.offline_bundles[g.task.id]
                g.bundles = [kept] if kept is not None else []
            return groups
        if mode == "orsd":
            for g in groups:
                if not g.rewards_differ:
                    g.reason = "rewards equal within the group: no ρ defined, bundles not generated"
            groups = [g for g in groups if g.rewards_differ]
        count = 1 if mode == "single_bundle" else r.num_bundles
        rubric_stage.generate_bundles(self.engine, self.tokenizer, groups, count, sampling,
                                      r.transcript_chars, template)
        return groups

    def verify(self, groups: list[Group]) -> None:
        """Only Spearman selection needs scores; the ablations make no verifier calls."""
        if self.config.rubric.mode == "orsd":
            rubric_stage.verify(self.verifier, [g for g in groups if g.bundles], self.config.rubric.transcript_chars)

    def align(self, groups: list[Group]) -> None:
        method = {"orsd": "spearman", "random_bundle": "random"}.get(self.config.rubric.mode, "single")
        rubric_stage.align(groups, method, np.random.default_rng((self.config.train.seed, self.step_index)))

    def paired_replay(self, groups: list[Group]):
        cfg = self.config
        records, advantages, rubrics = [], [], []
        template = cfg.rubric.context_template or None
        for group in groups:
            bundle = group.selected_bundle if cfg.uses_rubrics else None
            ids = None
            if bundle is not None:
                text = rubric.rubric_context(bundle, template=template)
                ids = rubric_stage.rubric_ids(self.tokenizer, text, cfg.rubric.context_role)
            for trajectory in group.trajectories:
                for record in trajectory.records:
                    records.append(record)
                    advantages.append(trajectory.advantage)
                    fits = (ids is not None and record.rubric_slot >= 0
                            and record.num_tokens + len(ids) <= cfg.rollout.max_context_tokens)
                    rubrics.append(ids if fits else None)  # e = 0 where splicing is impossible
        replay = paired_replay(self.policy, records, advantages, rubrics,
                               cfg.rubric.alpha if cfg.uses_rubrics else 0.0, cfg.rollout.temperature,
                               cfg.replay.token_budget, cfg.replay.fused, self.replay_lockstep)
        self.keep_delta_examples(groups, replay)
        return replay

    def keep_delta_examples(self, groups: list[Group], replay) -> None:
        """Per-token Δ of the first trajectory of each group with B*, for records and the report."""
        cu, index = replay.packed.cu_seqlens.tolist(), 0
        for group in groups:
            for number, trajectory in enumerate(group.trajectories):
                turns = []
                for record in trajectory.records:
                    start, end = cu[index] + len(record.context_ids), cu[index + 1]
                    index += 1
                    if number == 0 and group.selected is not None:
                        turns.append({"tokens": [self.tokenizer.decode([i]) for i in record.response_ids],
                                      "delta": replay.delta[start:end].tolist(),
                                      "valid": replay.valid[start:end].tolist()})
                if turns:
                    group.delta_example = {"trajectory": 0, "turns": turns}

    def reference_logprobs(self, replay) -> torch.Tensor:
        if not self.config.optim.kl_coef:
            return replay.old_logprobs
        p = replay.packed
        return replay_logprobs(self.reference, p.ids, p.cu_seqlens, p.response_mask,
                               self.config.rollout.temperature, self.config.replay.token_budget,
                               self.config.replay.fused)  # the reference is a plain full copy per rank

    def update(self, replay, reference: torch.Tensor) -> dict:
        o, p = self.config.optim, replay.packed
        if p.num_sequences == 0 and self.dist is None:
            return {}
        return update(self.policy, self.optimizer, p, replay.old_logprobs, reference, replay.advantages,
                      temperature=self.config.rollout.temperature, micro_batch_tokens=o.micro_batch_tokens,
                      clip_eps=o.clip_eps, dual_clip=o.dual_clip, log_ratio_clamp=o.log_ratio_clamp,
                      kl_coef=o.kl_coef, grad_clip=o.grad_clip, lockstep=self.lockstep,
                      backward=self.backward, step=self.optimizer_step,
                      scheduler=None if self.ds_engine is not None else self.scheduler,
                      precision=self.config.model.autocast)

    def save_policy(self, path) -> None:
        """An HF-loadable copy of the current policy; under ZeRO-3 all ranks gather, rank 0 writes."""
        with gathered(*self.policy.parameters()) if self.dist and self.dist.zero_stage == 3 else nullcontext():
            if self.rank == 0:
                self.policy.save_pretrained(path)

    # -- records -----------------------------------------------------------------------------------
    def metrics(self, groups: list[Group], replay, update_metrics: dict) -> dict:
        trajectories = [t for g in groups for t in g.trajectories]
        response = replay.packed.response_mask
        valid = replay.valid
        delta = replay.delta[valid]
        selected = [g for g in groups if g.selected is not None]
        chosen_rho = [g.rho[g.selected] for g in selected if g.rho]
        out = {
            "step": self.step_index,
            "reward_mean": float(np.mean([t.reward for t in trajectories])) if trajectories else 0.0,
            "success_rate": float(np.mean([t.won for t in trajectories])) if trajectories else 0.0,
            "score_mean": float(np.mean([t.score for t in trajectories])) if trajectories else 0.0,
            "turns_mean": float(np.mean([len(t.records) for t in trajectories])) if trajectories else 0.0,
            "valid_action_rate": _mean([r.valid_action for t in trajectories for r in t.records]),
            "env_errors": sum(bool(t.error) for t in trajectories),
            "groups_rewards_differ": _mean([g.rewards_differ for g in groups]),
            "groups_with_bundle": _mean([g.selected is not None for g in groups]),
            "bundles_parsed": sum(len(g.bundles) for g in groups),
            "bundles_discarded": sum(len(g.bundle_errors) for g in groups),
            "rho_selected_mean": float(np.mean(chosen_rho)) if chosen_rho else None,
            "advantage_abs_mean": float(replay.advantages[response].abs().mean()) if response.any() else 0.0,
            "delta_mean": float(delta.mean()) if len(delta) else 0.0,
            "delta_abs_mean": float(delta.abs().mean()) if len(delta) else 0.0,
            "valid_token_fraction": float(valid[response].float().mean()) if response.any() else 0.0,
            "response_tokens": int(response.sum()),
            "replay_rollout_gap": replay.rollout_gap,
        }
        out.update({k: v for k, v in update_metrics.items()})
        if self.verifier is not None and hasattr(self.verifier, "stats"):
            out["verifier"] = self.verifier.stats(reset=True)  # this step's accounting
        return out


def warmup_schedule(optimizer, warmup_steps: int):
    """Linear warm-up over `warmup_steps` optimizer steps, then the constant base rate."""
    warmup = max(warmup_steps, 0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0


@contextmanager
def timed(seconds: dict, name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


def make_env(config: Config):
    options = dict(config.env.options)
    if config.env.max_actions:
        options.setdefault("max_actions", config.env.max_actions)
    return envs.make(config.env.name, split=config.env.split, seed=config.env.seed, **options)
