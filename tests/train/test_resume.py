"""A run killed after step k and resumed gives the same records and weights as an unbroken run;
--resume continues with the run's own config, refuses a change that would alter the results, says
what to do when there is nothing to resume, and leaves a complete run untouched."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from orsd.train import checkpoint
from orsd.train.cli import RunError, main, resolve_config, run
from orsd.train.config import load_config, to_yaml
from orsd.train.trainer import Trainer

COMPARED = ("reward_mean", "success_rate", "turns_mean", "response_tokens", "loss", "pg_loss", "kl", "entropy",
            "grad_norm", "replay_rollout_gap", "groups_rewards_differ", "groups_with_bundle")


def config_for(model_dir, steps, *extra):
    # model.autocast pinned: 'auto' on a CPU without native bf16 measures a matmul, and two fresh runs
    # under other load may choose differently (each resume keeps its run's choice: the test below)
    return load_config(None, [f"model.path={model_dir}", f"train.steps={steps}", "train.save_every=1",
                              "model.autocast=",
                              "train.keep_checkpoints=2", "train.progress=false", "train.report=false",
                              "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                              "rollout.max_context_tokens=4096", "env.max_actions=2", "rubric.max_new_tokens=8",
                              "rubric.num_bundles=2", "warm_start.episodes=2", "warm_start.epochs=1",
                              "optim.lr=1e-3", *extra])


def records(run_dir):
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    groups = [json.loads(line) for line in (run_dir / "groups.jsonl").read_text().splitlines()]
    for g in groups:
        g.pop("verifier_events", None)
    return [{k: s[k] for k in COMPARED} for s in steps], groups


def weights(run_dir):
    path = checkpoint.latest(run_dir)
    return load_file(next(path.glob("*.safetensors")))


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("optim.train_layers=1", "model.autocast=bfloat16")],
                         ids=["all-layers", "top-layer-bf16-frozen"])
def test_killed_then_resumed_equals_unbroken(extra, tiny_smol_dir, tmp_path, monkeypatch):
    """Also with the lower layer frozen and stored in bf16: the checkpoint holds it in bf16, a
    resumed run loads it as f32 and stores it in bf16 again, its optimizer has the same parameters."""
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    run(load_config_steps := config_for(tiny_smol_dir, 3, *extra), str(unbroken), log=lambda *_: None)
    assert load_config_steps.warm_start.enabled  # the reference is the warm-started policy

    calls = {"n": 0}
    real_step = Trainer.step

    def dies_in_third_step(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real_step(self)

    monkeypatch.setattr(Trainer, "step", dies_in_third_step)
    with pytest.raises(KeyboardInterrupt):
        run(config_for(tiny_smol_dir, 3, *extra), str(broken), log=lambda *_: None)
    monkeypatch.setattr(Trainer, "step", real_step)
    assert [n for n, _ in checkpoint.step_dirs(broken)] == [1, 2]
    with pytest.raises(RunError, match="pass --resume"):  # never silently mixes two runs
        run(config_for(tiny_smol_dir, 3, *extra), str(broken), log=lambda *_: None)
    chosen = json.loads((broken / "environment.json").read_text())["precision"]
    run(config_for(tiny_smol_dir, 3, *extra), str(broken), resume=True, log=lambda *_: None)
    kept = json.loads((broken / "environment.json").read_text())["precision"]
    assert kept["autocast"] == chosen["autocast"]
    assert kept["reason"].endswith("(kept from the run's first process on resume)")

    steps_a, groups_a = records(unbroken)
    steps_b, groups_b = records(broken)
    assert len(steps_a) == len(steps_b) == 3
    assert steps_a == steps_b
    assert groups_a == groups_b
    wa, wb = weights(unbroken), weights(broken)
    assert wa.keys() == wb.keys()
    frozen_dtype = torch.bfloat16 if extra else torch.float32  # the case under test did happen
    assert wa["model.layers.0.mlp.up_proj.weight"].dtype == wb["model.layers.0.mlp.up_proj.weight"].dtype == frozen_dtype
    assert wa["model.layers.1.mlp.up_proj.weight"].dtype == torch.float32
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    assert [n for n, _ in checkpoint.step_dirs(broken)] == [2, 3]  # keep-last-2

    before, said = snapshot(broken), []
    assert run(config_for(tiny_smol_dir, 3, *extra), str(broken), resume=True, log=said.append) is None
    assert "is complete: 3 steps done" in said[-1]
    assert snapshot(broken) == before  # no summary appended, no checkpoint rewritten


def snapshot(run_dir):
    """Every file under the run directory: content hash and modification time."""
    return {str(p.relative_to(run_dir)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def fake_run(run_dir, steps_done, checkpoint_at=None, overrides=()):
    """A run directory as a run leaves it (config.yaml, steps.jsonl, maybe a checkpoint), without training."""
    config = load_config(None, ["model.autocast=", "rubric.alpha=0.05", "train.steps=2", *overrides])
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(config))
    (run_dir / "steps.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in range(1, steps_done + 1)))
    if checkpoint_at is not None:
        (run_dir / "checkpoints" / f"step_{checkpoint_at}").mkdir()
        (run_dir / "checkpoints" / f"step_{checkpoint_at}" / "trainer_state.pt").write_bytes(b"state")
    return config


def test_resume_without_a_checkpoint_says_so_and_what_to_do(tmp_path, capsys):
    fake_run(tmp_path / "run", steps_done=3)
    before = snapshot(tmp_path / "run")
    assert main(["--resume", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no checkpoint to resume from (3 steps recorded" in err
    assert "new --run-dir" in err and f"remove {tmp_path / 'run'}" in err and "pass --resume" not in err
    assert snapshot(tmp_path / "run") == before


def test_resume_of_a_directory_without_a_run(tmp_path, capsys):
    assert main(["--resume", "--run-dir", str(tmp_path / "nothing")]) == 2
    assert "holds no run (no config.yaml): start one without --resume" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_a_fresh_run_never_writes_into_another_run(tmp_path, capsys):
    fake_run(tmp_path / "with", steps_done=2, checkpoint_at=2)
    fake_run(tmp_path / "without", steps_done=2)
    assert main(["--run-dir", str(tmp_path / "with")]) == 2
    assert "already holds a run (last checkpoint step_2): pass --resume" in capsys.readouterr().err
    assert main(["--run-dir", str(tmp_path / "without")]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint to resume from: use a new --run-dir" in err and "pass --resume" not in err


def test_resume_reads_the_runs_own_config_with_overrides_on_top(tmp_path):
    fake_run(tmp_path / "run", steps_done=2, checkpoint_at=2, overrides=["rubric.num_bundles=3"])
    config = resolve_config(None, ["train.steps=5"], str(tmp_path / "run"), resume=True)
    # the embedded default would give autocast bfloat16, alpha 0.01, 2 bundles
    assert (config.model.autocast, config.rubric.alpha, config.rubric.num_bundles) == ("", 0.05, 3)
    assert config.train.steps == 5


def test_resume_refuses_a_key_that_changes_results(tmp_path, capsys):
    fake_run(tmp_path / "run", steps_done=1, checkpoint_at=1)
    before = snapshot(tmp_path / "run")
    assert main(["--resume", "--run-dir", str(tmp_path / "run"), "rubric.alpha=0.1", "train.progress=false"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"rubric.alpha was 0.05 in {tmp_path / 'run' / 'config.yaml'}, now 0.1" in err
    assert "train.progress" not in err.split("keys that may change")[0]  # a resumable key is not refused
    assert snapshot(tmp_path / "run") == before


def test_resume_of_a_complete_run_changes_nothing(tmp_path, capsys):
    fake_run(tmp_path / "run", steps_done=2, checkpoint_at=2)
    before = snapshot(tmp_path / "run")
    assert main(["--resume", "--run-dir", str(tmp_path / "run"), "train.progress=false"]) == 0
    out = capsys.readouterr().out
    assert "resume: train.progress changed from True to False" in out
    assert "is complete: 2 steps done (train.steps=2)" in out and "train.steps=N" in out
    assert snapshot(tmp_path / "run") == before


def test_a_resumed_run_keeps_the_precision_its_first_process_chose(tmp_path):
    """'auto' measured bf16 faster in the run's first process: the resume keeps bf16 without measuring
    (a probe under other load could choose fp32 and change every number after the resume)."""
    from orsd.train.build import recorded_precision

    (tmp_path / "environment.json").write_text(json.dumps({"precision": {
        "requested": "auto", "autocast": "bfloat16", "reason": "no AMX/AVX-512-BF16, and a probe ran bf16 at 1.30x",
        "probe_speedup": 1.3}}))
    kept = recorded_precision(tmp_path, "auto")
    assert (kept.autocast, kept.probe_speedup) == ("bfloat16", 1.3)
    assert kept.reason == ("no AMX/AVX-512-BF16, and a probe ran bf16 at 1.30x "
                           "(kept from the run's first process on resume)")
    (tmp_path / "environment.json").write_text(json.dumps({"precision": kept.as_dict()}))
    assert recorded_precision(tmp_path, "auto").reason == kept.reason  # said once, however often it resumes
    assert recorded_precision(tmp_path, "") is None  # the config now asks otherwise: its own choice
    assert recorded_precision(tmp_path / "none", "auto") is None


def test_a_loaded_policy_owns_storage_on_the_allocators_boundary(tmp_path):
    """Weights read from safetensors are views into the file's buffer at offsets that depend on what
    the process allocated before (a resumed run loads into another history than an unbroken one);
    kernels whose sums depend on alignment then round otherwise (issue 66, resume on a Xeon). Every
    tensor of a loaded policy must start on the CPU allocator's 64-byte boundary, in its own storage."""
    import torch

    from orsd.train.model import ALIGNMENT, load_policy
    from tiny_model import make_tiny_qwen3, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    make_tiny_qwen3(tokenizer, layers=3).save_pretrained(tmp_path / "policy")
    padding = [torch.empty(n) for n in (3, 5, 7)]  # another allocation history before the load
    model = load_policy(str(tmp_path / "policy"), "float32", "cpu")
    tensors = [*model.parameters(), *model.buffers()]
    assert len(tensors) > 10
    assert [t.data_ptr() % ALIGNMENT for t in tensors] == [0] * len(tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)  # no shared file buffer
    del padding
