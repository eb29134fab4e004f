"""The verifier of a run, from its config: a real endpoint when one is configured, else a frozen
local model (the reference copy of the initial policy; no second copy is made)."""

from __future__ import annotations

from orsd import rubric


def build_verifier(config, frozen_model, tokenizer):
    v = config.verifier
    kind = v.kind if v.kind != "auto" else ("openai" if v.base_url else "local")
    if kind == "openai":
        return rubric.OpenAIVerifier(
            v.base_url, v.model, api_key_env=v.api_key_env or None, concurrency=v.concurrency,
            max_retries=v.max_retries, timeout=v.timeout_seconds, cache_dir=v.cache_dir or None,
            mode=v.mode, scoring=v.scoring, max_tokens=v.max_new_tokens, seed=config.train.seed)
    return rubric.LocalVerifier(frozen_model, tokenizer, mode=v.mode, scoring=v.scoring,
                                max_new_tokens=v.max_new_tokens,
                                max_prompt_tokens=config.rollout.max_context_tokens)
