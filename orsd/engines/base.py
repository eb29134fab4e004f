"""The rollout engines' shared interface: what a request asks for (`Sampling`), what comes back
(`Generation`), the `RolloutEngine` protocol every engine meets, and `stop_ids` (where a turn ends).

Every engine takes prompts as token ids (never text) and returns exactly the sampled ids, so
records are token-in/token-out. Log-probs are those of the temperature-scaled distribution
(log_softmax(logits / temperature)), the same quantity paired replay recomputes; top-p only
shapes what is sampled, and so does top-k, which is off unless asked for.

`Sampling.seed` with request `keys` asks for keyed sampling: every request draws from its own random
stream, seeded by `key_seed(seed, key)`, so what one request samples depends on its prompt, key and
the model alone, not on the other requests of the call, how they are batched or what ran before
(held-out evaluation: common random numbers across batches, runs and policies).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    greedy: bool = False
    # hf engine only (vLLM has no such option): forbid any repeated n-gram of this size. Used for
    # bundle generation, whose tokens are never trained on; rollouts keep it 0 so their log-probs
    # stay those of the temperature-scaled policy.
    no_repeat_ngram_size: int = 0
    # keep only the k most likely tokens before top-p (0: off). Like top-p it shapes only what is
    # sampled: the log-probs stay those of the whole temperature-scaled distribution (hf engine)
    top_k: int = 0
    # hf engine only: speculative decoding with up to this many looked-up draft tokens per step
    # (engines/speculative.py; 0: off). What is sampled keeps its distribution; the ids a seed gives
    # differ from the plain loop's.
    draft_tokens: int = 0
    # keyed sampling (module docstring): each request samples from a stream seeded by
    # key_seed(seed, its key); the caller must give keys. None: the engine's own seeding (hf: the
    # global torch generator over the whole batch; vllm: its engine seed with the key)
    seed: int | None = None


@dataclass
class Generation:
    ids: list[int]  # sampled ids, up to and including the end-of-turn token when one was sampled
    logprobs: list[float]  # one per id
    finished: bool  # False: the token budget ran out first


class RolloutEngine(Protocol):
    """`keys` name each request stably (step, task, sample, turn); an engine that can seed per
    request seeds from them, so sampling does not depend on how requests are batched or split
    across ranks. With `sampling.seed` set every engine must: keyed sampling (module docstring)."""

    def generate(self, prompts: list[list[int]], sampling: Sampling,
                 keys: list[str] | None = None) -> list[Generation]: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


def key_seed(seed: int, key: str) -> int:
    """A 63-bit seed from (seed, request key): the same request draws the same stream on any rank,
    in any batch (blake2b, not Python's salted hash, so it is the same in every process)."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_keys(prompts: list, sampling: Sampling, keys: list[str] | None) -> None:
    """Both engines refuse keys that do not name every prompt, and keyed sampling without keys."""
    if keys is not None and len(keys) != len(prompts):
        raise ValueError(f"keys: {len(keys)} keys for {len(prompts)} prompts: expected one key per prompt")
    if sampling.seed is not None and keys is None:
        raise ValueError(f"sampling.seed={sampling.seed} asks for keyed sampling: expected keys, one stable "
                         "key per prompt")


def stop_ids(tokenizer, model) -> list[int]:
    """End-of-turn ids: the tokenizer's eos plus the model's generation-config eos ids."""
    ids = []
    for candidate in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        for value in candidate if isinstance(candidate, list) else [candidate]:
            if value is not None and value not in ids:
                ids.append(int(value))
    if not ids:
        raise ValueError("the tokenizer and model define no eos token: cannot tell where a turn ends")
    return ids
