"""replay.overlap: the bundles written on a thread of their own, by a twin of the policy, while the
plain pass runs; the step's results are those of the stages one after the other."""

import copy
import threading

import pytest
import torch

from orsd.train.overlap import Beside, twin
from scripted import ScriptedEngine, small_config
from test_step import ScriptedVerifier, make_trainer


def test_a_twin_shares_every_tensor_and_no_module(tiny_model):
    other = twin(tiny_model)
    assert all(a is b for a, b in zip(tiny_model.parameters(), other.parameters()))
    assert all(a is b for a, b in zip(tiny_model.buffers(), other.buffers()))
    assert not any(a is b for a, b in zip(tiny_model.modules(), other.modules()))
    assert other.config is not tiny_model.config
    tiny_model.train()
    other.eval()
    other.set_attn_implementation("eager")
    assert tiny_model.training and tiny_model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        tiny_model.lm_head.weight.add_(1.0)  # an update in place reaches the twin
    assert torch.equal(other.lm_head.weight, tiny_model.lm_head.weight)


def test_beside_reraises_on_the_callers_thread_and_runs_on_one_intra_op_thread():
    def fails():
        raise RuntimeError("writer broke")

    worker = Beside(fails, lambda: torch.autocast("cpu", enabled=False))
    with pytest.raises(RuntimeError, match="writer broke"):
        worker.result()

    release, started = threading.Event(), threading.Event()

    def waits():
        started.set()
        assert release.wait(10)
        return torch.get_num_threads()

    worker = Beside(waits, lambda: torch.autocast("cpu", enabled=False))
    assert started.wait(10)
    assert any(t.name == "orsd-bundles" for t in threading.enumerate())  # still running, on its thread
    release.set()
    assert worker.result() == 1  # one intra-op thread on its own thread


class HeldEngine(ScriptedEngine):
    """Test fake: a ScriptedEngine whose bundle writing waits until the main thread has finished the
    plain pass (the trainer's own order with overlap on), so the test cannot pass with the stages
    one after the other; it records the threads it ran on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plain_done = threading.Event()
        self.threads: list[str] = []

    def generate(self, prompts, sampling, keys=None):
        if keys and ":bundle:" in keys[0]:
            self.threads.append(threading.current_thread().name)
            assert self.plain_done.wait(60), "the plain pass never ran beside the bundles"
        return super().generate(prompts, sampling, keys)


def run_step(model, tokenizer, overlap: bool, held: bool = False):
    config = small_config("method.name=orsd", "rubric.alpha=0.5", "optim.kl_coef=0.05",
                          f"replay.overlap={str(overlap).lower()}")
    trainer = make_trainer(config, model, tokenizer, ScriptedVerifier())
    threads = {"plain": [], "reference": []}  # intra-op threads each pass ran on
    if held:
        trainer.engine = trainer.writer.engine = HeldEngine(model, tokenizer, config.env.name)
        plain_pass, reference_logprobs = trainer.plain_pass, trainer.reference_pass.logprobs

        def plain_then_release(groups):
            threads["plain"].append(torch.get_num_threads())
            try:
                return plain_pass(groups)
            finally:
                trainer.engine.plain_done.set()

        def reference(replay, frozen_states):
            writing = any(t.name == "orsd-bundles" for t in threading.enumerate())
            threads["reference"].append((torch.get_num_threads(), writing))
            return reference_logprobs(replay, frozen_states)

        trainer.plain_pass, trainer.reference_pass.logprobs = plain_then_release, reference
    return trainer, trainer.step(), threads


def test_a_step_with_bundles_beside_the_plain_pass_is_the_step_without(tiny_model, tiny_tokenizer):
    """The same step with replay.overlap on (the writer held until the plain pass is done, so the
    pass really runs beside it; the reference pass after, on both threads) and off: the same
    bundles, log-probs, Δ, advantages, reference and weights after the update."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # overlap serves from two intra-op threads (this machine's default)
    try:
        beside_model, alone_model = copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)
        trainer, beside, threads_in = run_step(beside_model, tiny_tokenizer, overlap=True, held=True)
        assert torch.get_num_threads() == 2  # restored after the stage
        _, alone, _ = run_step(alone_model, tiny_tokenizer, overlap=False)
    finally:
        torch.set_num_threads(threads)
    assert trainer.engine.threads and set(trainer.engine.threads) == {"orsd-bundles"}
    assert threads_in["plain"] == [1]  # the plain pass left the other core to the writer
    assert threads_in["reference"] == [(2, False)]  # after the bundles, on both cores
    a, b = beside.outputs, alone.outputs
    assert [c.texts for c in a.candidates] == [c.texts for c in b.candidates]
    assert [s.index for s in a.selection] == [s.index for s in b.selection] == [0, 0]
    for name in ("old_logprobs", "delta", "valid", "advantages"):
        assert torch.equal(getattr(a.replay, name), getattr(b.replay, name)), name
    assert a.replay.valid.any() and a.replay.delta.abs().max() > 0
    for key in ("loss", "kl", "grad_norm"):
        assert beside.metrics[key] == alone.metrics[key], key
    for p, q in zip(beside_model.parameters(), alone_model.parameters()):
        assert torch.equal(p, q)
    assert {"bundles", "replay", "reference", "update"} <= set(beside.seconds)


def test_no_overlap_on_one_thread_or_without_bundles(tiny_model, tiny_tokenizer, one_torch_thread):
    trainer = make_trainer(small_config("method.name=orsd"), tiny_model, tiny_tokenizer, ScriptedVerifier())
    assert not trainer.overlaps()  # one intra-op thread: nothing to put beside
    torch.set_num_threads(2)
    assert trainer.overlaps()
    assert not make_trainer(small_config("method.name=grpo"), tiny_model, tiny_tokenizer).overlaps()
    assert not make_trainer(small_config("method.name=orsd", "replay.overlap=false"), tiny_model, tiny_tokenizer,
                            ScriptedVerifier()).overlaps()


def test_no_overlap_where_threads_cannot_be_set(tiny_model, tiny_tokenizer, monkeypatch):
    """As after vLLM's in-process CPU worker, which makes torch.set_num_threads a no-op."""
    trainer = make_trainer(small_config("method.name=orsd"), tiny_model, tiny_tokenizer, ScriptedVerifier())
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert trainer.overlaps()
        monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
        assert not trainer.overlaps()
    finally:
        torch._C.set_num_threads(threads)
