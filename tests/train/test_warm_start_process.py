"""warm_start.process: the fit in a spawned child process gives the RL phase the same policy as the
fit in place, and `auto` picks the child only where it pays (one process, on a CPU)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from orsd.train.build import build
from orsd.train.config import load_config
from orsd.train.warmstart import runs_in_child


def config_for(model_dir, process):
    return load_config(None, [f"model.path={model_dir}", "method.name=grpo", "model.autocast=",
                              "warm_start.enabled=true", "warm_start.episodes=2", "warm_start.epochs=2",
                              "warm_start.batch_size=4", "warm_start.bundle_demos=0", f"warm_start.process={process}",
                              "optim.train_layers=1", "train.progress=false"])


def test_the_fit_in_a_child_process_equals_the_fit_in_place(tiny_smol_dir, one_torch_thread):
    """Same demonstrations, seed and threads (one, not torch's default: the child must take ours):
    the same losses and weights, loaded from the child's save (a temporary dir when there is no run
    dir); its summary line reaches our log. Equal to f32
    rounding, not bitwise: in CI's full test run (2026-12-01, Intel Xeon) the sixth loss differed in
    its 7th digit (10.728445 vs 10.728448), alone it matched bitwise; MKL's f32 GEMM is not
    bitwise-stable across calling contexts (docs/ops.md). A fit that went wrong differs far more:
    the fitted weights are checked against the initial ones below."""
    lines = []
    child, child_losses = build(config_for(tiny_smol_dir, "child"), log=lines.append)
    inline, inline_losses = build(config_for(tiny_smol_dir, "inline"), log=lambda *_: None)
    assert len(child_losses) >= 2 and child_losses == pytest.approx(inline_losses, rel=1e-6, abs=0)
    assert child_losses[0] != child_losses[1]  # the fit moved the weights between its steps
    [summary] = [line for line in lines if line.startswith("warm start:")]
    assert f"{len(child_losses)} steps" in summary
    for module in ("policy", "reference"):
        ours, theirs = getattr(child, module).state_dict(), getattr(inline, module).state_dict()
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert ours[name].dtype == theirs[name].dtype, name
            torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)
    initial = build(load_config(None, [f"model.path={tiny_smol_dir}", "method.name=grpo", "model.autocast=",
                                       "train.progress=false"]), log=lambda *_: None)[0].policy.state_dict()
    moved = max((initial[n] - t).abs().max().item() for n, t in child.policy.state_dict().items())
    assert moved > 1e-3  # a thousand times what the two ways may differ by


def test_auto_isolates_a_single_process_cpu_run_only():
    config = SimpleNamespace(warm_start=SimpleNamespace(process="auto"))
    assert runs_in_child(config, torch.device("cpu"), distributed=False)
    assert not runs_in_child(config, torch.device("cuda", 0), distributed=False)
    assert not runs_in_child(config, torch.device("cpu"), distributed=True)
    config.warm_start.process = "inline"
    assert not runs_in_child(config, torch.device("cpu"), distributed=False)
    config.warm_start.process = "child"
    assert runs_in_child(config, torch.device("cuda", 0), distributed=False)
    with pytest.raises(ValueError, match=r"warm_start.process=child: not supported on a distributed run"):
        runs_in_child(config, torch.device("cpu"), distributed=True)


def test_an_unknown_process_is_refused():
    from orsd.train.config import ConfigError

    with pytest.raises(ConfigError, match=r"warm_start.process.*'thread'"):
        load_config(None, ["warm_start.process=thread"])


def test_a_child_that_fails_is_reported_with_its_exit_status(tmp_path):
    """The training process loads nothing before the child: a bad model.path fails there, and the
    error says so (the child's own traceback is on stderr above it)."""
    config = load_config(None, [f"model.path={tmp_path / 'missing'}", "warm_start.enabled=true",
                                "warm_start.process=child", "train.progress=false"])
    with pytest.raises(RuntimeError, match=r"warm start's child process failed with exit status 1 \(its traceback "
                                           r"is above\); warm_start.process=inline"):
        build(config, log=lambda *_: None)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_a_policy_loaded_on_the_cpu_keeps_no_view_of_its_checkpoint_file(tiny_model, tmp_path):
    """Loaded memory-mapped, f32 weights from an f32 file stay views of the mapping, and the whole
    file stays resident beside every copy made later (the warm start's checkpoint in the default
    run: 525 MB); load_policy reads it into memory instead."""
    from orsd.train.model import load_policy

    tiny_model.save_pretrained(tmp_path)
    weights = next(tmp_path.glob("*.safetensors"))
    policy = load_policy(str(tmp_path), "float32", "cpu")
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(weights) in line]
    assert mapped == []
    for name, tensor in tiny_model.state_dict().items():  # and it is the checkpoint's content
        assert torch.equal(policy.state_dict()[name], tensor), name
