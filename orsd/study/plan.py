"""What a study will run, resolved and validated before anything starts: the base config, one config
per arm, the shared initial policy's run (when the config warm-starts), and each run's overrides.

Every arm starts from the same policy. A config without a warm start gives every arm `model.path`
as it is. A config with one has it run ONCE, as `orsd-train train.steps=0` into OUT/initial/
(which saves the warm-started policy as OUT/initial/checkpoints/reference/, with warm_start.json
beside it), and every run then gets `model.path=OUT/initial/checkpoints/reference
warm_start.enabled=false`: no run fits its own warm start. warm_start.json tells orsd-train that the
policy was shown bundle demonstrations, so ORSD's speculative bundle decoding drafts from the same
criteria pool as after an in-run warm start (orsd/train/warmstart.py: draft_corpus).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .grid import INITIAL, Arm, Run, StudyError, run_path


#: the config keys the warm start reads (warmstart.run_warm_start, model loading, the demos' prompts)
WARM_START_INPUTS = ("model.", "env.", "warm_start.", "rollout.", "rubric.transcript_chars",
                     "rubric.generation_template", "optim.lm_head", "optim.share_prefix", "replay.token_budget",
                     "train.seed", "method.name")


@dataclass
class Initial:
    """The shared initial policy: the run that makes it and the policy directory it leaves."""

    path: Path
    overrides: list[str]
    method: str

    @property
    def policy(self) -> Path:
        return self.path / "checkpoints" / "reference"

    def changed_keys(self, config: str | None) -> list[str]:
        """Warm-start inputs whose value in the initial run's config.yaml differs from what the study would
        run now (its thread count aside, which follows the machine); [] when there is no such run yet."""
        import yaml

        from orsd.train.config import to_dict

        saved = self.path / "config.yaml"
        if not saved.is_file():
            return []
        before = _flat(yaml.safe_load(saved.read_text()) or {})
        now = _flat(yaml.safe_load(yaml.safe_dump(to_dict(_load(config, self.overrides, "the initial policy")))))
        return sorted(key for key in before.keys() | now.keys() if before.get(key) != now.get(key)
                      and key.startswith(WARM_START_INPUTS) and key != "model.threads")

    def finished(self) -> bool:
        """orsd-train appends summary.jsonl last, after the policy and the step-0 checkpoint are saved."""
        return (self.path / "summary.jsonl").is_file() and (self.policy / "config.json").is_file()


#: the config keys that decide what a held-out evaluation of one policy gives: an arm that changes none
#: of them shares the start evaluation of its seed
EVAL_INPUTS = ("model.", "env.", "rollout.", "train.eval_", "train.seed")


@dataclass
class StartEvaluation:
    """The held-out evaluation of the shared initial policy for one seed, run once and read by every arm
    that shares it (OUT/initial/eval/seed<S>/eval.jsonl): with per-episode random streams it is exactly
    what each run's own step-0 evaluation would sample, so repeating it per arm only cost time."""

    seed: int
    path: Path
    policy: str
    overrides: list[str]

    def finished(self) -> bool:
        from .grid import has_eval

        return has_eval(self.path, 0)


@dataclass
class Plan:
    out: Path
    config: str | None
    arms: list[Arm]
    seeds: list[int]
    sets: list[str]
    launcher: list[str]
    jobs: int
    threads: int
    base: dict
    initial: Initial | None
    runs: list[Run]
    start_evaluations: list[StartEvaluation]


def _flat(data: dict) -> dict:
    return {f"{section}.{key}": value for section, keys in data.items() if isinstance(keys, dict)
            for key, value in keys.items()}


def _load(config: str | None, overrides: list[str], what: str):
    from orsd.train.config import ConfigError, load_config

    try:
        return load_config(config, overrides)
    except ConfigError as error:
        raise StudyError(f"{what}: {' '.join(str(error).splitlines())}") from None


def make_plan(config: str | None, arms: list[Arm], seeds: list[int], out: Path, sets: list[str], jobs: int,
              launcher: list[str], cores: int) -> Plan:
    """Resolve every arm's config now, so a bad key fails before hours of runs, not in the fifth one."""
    from orsd.methods import make_method
    from orsd.train.config import to_dict

    if jobs < 1:
        raise StudyError(f"--jobs {jobs}: expected a positive number of runs at once")
    out = Path(out)
    base = _load(config, sets, "--config/--set")
    threads = max(1, cores // jobs)
    resolved = {arm.label: _load(config, [*sets, *arm.overrides], f"--arms {arm.label}") for arm in arms}
    initial = None
    if base.warm_start.enabled:
        # the warm start of the first arm that writes bundles, so that its bundle demonstrations are
        # in the policy every arm starts from (a method without bundles never sees them)
        writer = next((arm for arm in arms if make_method(resolved[arm.label]).writes_bundles), arms[0])
        overrides = [*sets, *writer.overrides, "train.steps=0", "train.eval_before=false", "train.eval_every=0",
                     "train.report=false", "train.tensorboard=false", "train.progress=false",
                     "verifier.check_reachable=false", f"train.run_name={INITIAL}", f"model.threads={cores}"]
        _load(config, overrides, f"the initial policy's run (the warm start of --arms {writer.label})")
        initial = Initial(out / INITIAL, overrides, resolved[writer.label].method.name)
    policy = str(initial.policy) if initial is not None else base.model.path
    sharing = {arm.label for arm in arms
               if base.train.eval_before and _eval_inputs(resolved[arm.label]) == _eval_inputs(base)}
    evaluations = [StartEvaluation(seed, out / INITIAL / "eval" / f"seed{seed}", policy,
                                   [*sets, f"train.seed={seed}", f"model.threads={threads}"])
                   for seed in seeds] if sharing else []
    runs = []
    # seed by seed, every arm of a seed before the next: a grid stopped part-way holds whole seeds,
    # each arm paired with the baseline
    for seed in seeds:
        for arm in arms:
            run = Run(arm, seed, run_path(out, arm.label, seed), resolved[arm.label].train.steps,
                      resolved[arm.label].train.eval_every)
            run.overrides = [*sets, *arm.overrides, *shared_policy(initial), f"train.seed={seed}",
                             f"train.run_name={run.run_name}", "train.progress=false", f"model.threads={threads}",
                             *(["train.eval_before=false"] if arm.label in sharing else [])]
            _load(config, run.overrides, f"--arms {arm.label} with seed {seed}")
            runs.append(run)
    return Plan(out, config, arms, seeds, sets, launcher, jobs, threads, to_dict(base), initial, runs, evaluations)


def _eval_inputs(config) -> dict:
    from orsd.train.config import to_dict

    return {key: value for key, value in _flat(to_dict(config)).items() if key.startswith(EVAL_INPUTS)
            and key != "model.threads"}


def shared_policy(initial: Initial | None) -> list[str]:
    """What points a run at the shared initial policy; the autocast choice the initial run made is
    added at launch (`pinned_precision`), once that run exists."""
    if initial is None:
        return []
    return [f"model.path={initial.policy}", "warm_start.enabled=false"]


def pinned_precision(plan: Plan) -> list[str]:
    """model.autocast=auto probes the CPU when its flags do not decide, and a probe is a measurement:
    every run takes the choice the initial run made, so no arm computes in another precision."""
    if plan.initial is None or plan.base["model"]["autocast"] != "auto":
        return []
    environment = plan.initial.path / "environment.json"
    if not environment.is_file():
        return []
    chosen = (json.loads(environment.read_text()).get("precision") or {}).get("autocast")
    return [f"model.autocast={chosen or ''}"] if chosen is not None else []


def run_overrides(plan: Plan, run: Run, resume: bool) -> list[str]:
    """The run's overrides at launch; a resumed run keeps the thread count its config.yaml holds."""
    from .grid import saved_threads

    overrides = [*run.overrides, *pinned_precision(plan)]
    threads = saved_threads(run.path) if resume else None
    if threads is not None:
        overrides = [o for o in overrides if not o.startswith("model.threads=")] + [f"model.threads={threads}"]
    return overrides


def run_threads(overrides: list[str]) -> int:
    """The model.threads a run gets (the last override wins, as in orsd-train)."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith("model.threads=")]
    return int(values[-1]) if values else 0
