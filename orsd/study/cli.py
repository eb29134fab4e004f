"""`orsd-study`: run a grid of orsd-train runs (arms × seeds) from one shared initial policy, with
resume, then compare the arms with intervals over seeds (docs/study.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .grid import StudyError, launcher_argv, parse_arms, parse_overrides, parse_seeds
from .registration import ENDPOINTS

EPILOG = """arms: METHOD (= method.name=METHOD) or LABEL=section.key=value[,section.key=value...]; commas
separate overrides except inside [] {} or quotes, e.g. "wide=rubric.num_bundles=4,rollout.top_p=0.9".
example: orsd-study --config configs/cpu_study.yaml --arms grpo orsd "alpha0.1=method.name=orsd,rubric.alpha=0.1"
         --seeds 0 1 2 --out runs/study --jobs 2"""


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="orsd-study", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run every arm × seed as an orsd-train run under OUT/<arm>/seed<S>/ from one shared initial "
                    "policy (finished runs are skipped, killed ones resumed), then write OUT/study.md, study.html, "
                    "curves.png, heldout.png and summary.json.")
    parser.add_argument("--config", help="the YAML config every run starts from (default: the embedded default)")
    parser.add_argument("--arms", nargs="+", metavar="ARM", help="the arms (see below); required unless --report-only "
                        "reads them from OUT/study.json")
    parser.add_argument("--seeds", nargs="+", metavar="S", help="train.seed of each run of every arm (e.g. 0 1 2)")
    parser.add_argument("--out", required=True, help="the study directory")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, the CPU cores split evenly between them "
                        "(OMP_NUM_THREADS and model.threads); keep it the same across a study: the thread count "
                        "changes float rounding (default 1)")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", dest="sets",
                        help="overrides for every run and the initial policy (model.*, warm_start.*, train.steps...)")
    parser.add_argument("--baseline", help="the arm the others are paired against (default: the first grpo arm)")
    parser.add_argument("--endpoint", choices=list(ENDPOINTS), help="the primary endpoint, registered in study.json "
                        "before the first run (default heldout_score: held-out score at the last evaluation, paired "
                        "by seed against the baseline); a resumed study may not change it")
    parser.add_argument("--margin", type=float, help="the equivalence margin of the primary endpoint: 'equivalent' is "
                        "said only when a paired TOST within ±margin passes (default 0.05; registered, fixed)")
    parser.add_argument("--alpha", type=float, help="the tests' level, family-wise over the primary arms by Holm "
                        "(default 0.05; registered, fixed)")
    parser.add_argument("--exploratory", nargs="+", default=[], metavar="LABEL", help="arms reported as exploratory: "
                        "outside the Holm family of primary comparisons (registered with the study)")
    parser.add_argument("--window", type=int, default=5, help="steps at each end of the learning statistic (default 5)")
    parser.add_argument("--launcher", help="what runs `-m orsd.train.cli` (default: this Python); e.g. "
                        "'torchrun --nproc_per_node 4' for a multi-GPU run")
    parser.add_argument("--dry-run", action="store_true", help="print each run's state and command, run nothing")
    parser.add_argument("--report-only", action="store_true", help="write the report from OUT's runs as they are")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return study(args)
    except StudyError as error:
        print(f"orsd-study: {error}", file=sys.stderr)
        return 2


def study(args) -> int:
    from .outputs import write_outputs

    out = Path(args.out)
    recorded = json.loads((out / "study.json").read_text()) if (out / "study.json").is_file() else None
    if args.window < 1:
        raise StudyError(f"--window {args.window}: expected a positive number of steps")
    if args.report_only:
        if recorded is None:
            raise StudyError(f"--report-only: {out / 'study.json'} does not exist (expected the OUT of an earlier "
                             f"orsd-study run)")
        recorded["out"] = str(out)  # where the runs are now (a study's records may have moved since)
        if args.arms:
            recorded["arms"] = [arm.label for arm in parse_arms(args.arms)]
        if args.seeds:
            recorded["seeds"] = parse_seeds(args.seeds)
        recorded["registration"] = report_registration(recorded, args)
        return report(write_outputs, recorded, None, args)
    if not args.arms or not args.seeds:
        raise StudyError(f"{'--arms' if not args.arms else '--seeds'}: required (e.g. --arms grpo orsd --seeds 0 1 2)")
    plan = make(args)
    if args.dry_run:
        return dry_run(plan)
    from .runner import InitialFailed, make_initial, run_grid, run_start_evaluations

    record = study_record(plan, recorded, args)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "study.json", record)
    try:
        make_initial(plan)
        if plan.initial is not None:
            record["initial"] = initial_record(plan)
            record["initial_policies"] = known_policies(record)
            write_json(out / "study.json", record)
        run_start_evaluations(plan)
    except InitialFailed as error:
        print(f"orsd-study: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("orsd-study: interrupted; run the same command again to go on", file=sys.stderr)
        return 130

    def started(run) -> None:  # which initial policy, code and machine each run started from
        record.setdefault("runs", {})[run.name] = run_origin(record)
        write_json(out / "study.json", record)

    try:
        outcomes = run_grid(plan, progress=not args.no_progress, on_start=started)
    except KeyboardInterrupt:
        print("orsd-study: interrupted; the runs stopped and resume when the same command runs again",
              file=sys.stderr)
        return 130
    statuses = {o.run.name: o.status if o.status != "failed" else f"failed (exit status {o.returncode})"
                for o in outcomes}
    code = report(write_outputs, record, statuses, args)
    failed = [o.run.name for o in outcomes if o.status == "failed"]
    if failed:
        print(f"orsd-study: {len(failed)} run(s) failed: {', '.join(failed)} (their train.log says why; run the "
              f"same command again to retry them)", file=sys.stderr)
        return 1
    return code


def report_registration(recorded: dict, args) -> dict:
    """The registration a report reads: study.json's (then --endpoint/--margin/--alpha/--baseline may
    only repeat it), or for a study recorded before registration existed a post-hoc one."""
    from .registration import post_hoc, register

    labels = list(recorded["arms"])
    registration = recorded.get("registration")
    if registration is not None:
        return register(registration, [label for label in labels if label in registration["arms"]], [],
                        args.baseline or registration["baseline"], endpoint=args.endpoint, margin=args.margin,
                        alpha=args.alpha, started=True)
    methods = {label: method_of(recorded, label) for label in labels}
    from .summary import default_baseline

    return post_hoc(labels, args.baseline or default_baseline(labels, methods), endpoint=args.endpoint,
                    margin=args.margin, alpha=args.alpha)


def method_of(record: dict, label: str) -> str:
    """An arm's method.name from its overrides in study.json (an arm named by its method has none)."""
    overrides = (record.get("arm_overrides") or {}).get(label, [])
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("method.name=")), label)


def make(args):
    from .grid import cpu_cores
    from .plan import make_plan

    arms, seeds = parse_arms(args.arms), parse_seeds(args.seeds)
    sets = parse_overrides(args.sets)
    if args.config is not None and not Path(args.config).is_file():
        raise StudyError(f"--config {args.config!r}: no such file (expected a YAML config, "
                         f"e.g. configs/cpu_study.yaml)")
    if args.baseline is not None and args.baseline not in [arm.label for arm in arms]:
        raise StudyError(f"--baseline {args.baseline!r}: expected one of the arms' labels "
                         f"{[arm.label for arm in arms]}")
    return make_plan(args.config, arms, seeds, Path(args.out), sets, args.jobs, launcher_argv(args.launcher),
                     cpu_cores())


def dry_run(plan) -> int:
    import shlex

    from .grid import state, train_command
    from .plan import run_overrides

    print(f"# {len(plan.runs)} runs, {plan.jobs} at a time on {plan.threads} thread(s) each")
    if plan.initial is not None:
        what = "finished" if plan.initial.finished() else "new"
        print(f"# initial policy ({what}): {plan.initial.policy}")
        print(shlex.join(train_command(plan.launcher, plan.config, plan.initial.overrides, plan.initial.path)))
    for run in plan.runs:
        what = state(run)
        print(f"# {run.name}: {what}")
        if what != "finished":
            command = train_command(plan.launcher, plan.config, run_overrides(plan, run, what == "resume"),
                                    run.path, resume=what == "resume")
            print(shlex.join(command))
    return 0


def study_record(plan, recorded: dict | None, args) -> dict:
    """study.json: the whole study, not the last invocation: every seed and arm ever asked for (a
    later invocation may add some; an arm's overrides may not change), the registration, every initial
    policy with the runs that started from it, and each invocation's code, machine and arguments. A
    changed warm start is refused while OUT/initial holds the old one: every run there started from it."""
    from orsd.report.run_dir import git_sha

    from .registration import register
    from .summary import default_baseline

    recorded = recorded or {}
    overrides = dict(recorded.get("arm_overrides") or {})
    for arm in plan.arms:
        if arm.label in overrides and list(overrides[arm.label]) != list(arm.overrides):
            raise StudyError(f"--arms {arm.label}: this study's arm {arm.label!r} ran with {','.join(overrides[arm.label])}"
                             f"; an arm's overrides are fixed once it exists (give the new variant another label)")
        overrides[arm.label] = list(arm.overrides)
    labels = list(recorded.get("arms") or []) + [arm.label for arm in plan.arms if arm.label not in
                                                   (recorded.get("arms") or [])]
    seeds = list(recorded.get("seeds") or []) + [s for s in plan.seeds if s not in (recorded.get("seeds") or [])]
    base_method = plan.base["method"]["name"]
    methods = {label: next((o.split("=", 1)[1] for o in overrides[label] if o.startswith("method.name=")),
                           base_method) for label in labels}
    started = any(plan.out.glob("*/seed*/config.yaml")) or (plan.out / "initial").exists()
    registration = register(recorded.get("registration"), labels, list(args.exploratory),
                            args.baseline or (recorded.get("registration") or {}).get("baseline")
                            or default_baseline(labels, methods),
                            endpoint=args.endpoint, margin=args.margin, alpha=args.alpha, started=started)
    record = {**recorded, "out": str(plan.out), "config": plan.config, "sets": plan.sets, "arms": labels,
              "arm_overrides": overrides, "seeds": seeds, "jobs": plan.jobs, "threads_per_run": plan.threads,
              "launcher": plan.launcher, "git_sha": git_sha(), "base_config": plan.base,
              "registration": registration, "initial": recorded.get("initial")}
    record["invocations"] = [*(recorded.get("invocations") or []),
                             {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_sha": git_sha(),
                              "arms": [arm.label for arm in plan.arms], "seeds": plan.seeds, "jobs": plan.jobs,
                              "threads_per_run": plan.threads, "machine": machine()}]
    if plan.initial is not None:
        changed = plan.initial.changed_keys(plan.config) if plan.initial.finished() else []
        if changed:
            raise StudyError(f"--config/--set/--arms: the shared initial policy in {plan.initial.path} was made with "
                             f"other values of {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}, and "
                             f"every run there started from it: use a new --out, or remove {plan.initial.path} and "
                             f"the runs")
        before = recorded.get("initial") or {}
        record["initial"] = {**before, "overrides": plan.initial.overrides, "method": plan.initial.method,
                             "policy": str(plan.initial.policy)}
    return record


def initial_record(plan) -> dict:
    from .grid import directory_sha256

    policy = plan.initial.policy
    warm = policy / "warm_start.json"
    return {"overrides": plan.initial.overrides, "method": plan.initial.method, "policy": str(policy),
            "sha256": directory_sha256(policy),
            "warm_start": json.loads(warm.read_text()) if warm.is_file() else None}


def known_policies(record: dict) -> list[dict]:
    """Every initial policy this study has had (a refitted warm start on another machine differs in
    its last bits), the current one last, each with when it was first seen; the runs that started
    from each are in record["runs"]."""
    policies = [dict(p) for p in record.get("initial_policies") or []]
    current = (record.get("initial") or {}).get("sha256")
    if current and current not in [p["sha256"] for p in policies]:
        policies.append({"sha256": current, "first_seen": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "machine": machine()})
    return policies


def run_origin(record: dict) -> dict:
    """What a run started from: the initial policy's sha256, the code and the machine."""
    from orsd.report.run_dir import git_sha

    return {"initial_sha256": (record.get("initial") or {}).get("sha256"), "git_sha": git_sha(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine()}


def machine() -> dict:
    """The CPU's model name and the ISA flags that choose kernels (fp32 results can differ across them)."""
    import platform

    flags, name = set(), platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    isa = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))
    return {"cpu": name, "isa": isa}


def report(write_outputs, record: dict, statuses, args) -> int:
    try:
        written = write_outputs(record, statuses, args.baseline, args.window)
    except ValueError as error:
        raise StudyError(str(error)) from None
    print("\n".join(str(path) for path in written))
    return 0


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
