"""transformers' own `generate` as the reference the hf engine's decode loop is held to (engines/decode.py
samples the same ids with the same seed and settings)."""

from __future__ import annotations

import torch


def transformers_generate(model, prompts, pad_id, stop_ids, sampling):
    """transformers' own sampling loop on the same left-padded batch: the reference for decode.py.
    top_k=0 turns top-k off: with top_k=None transformers 5 applies its default of 50."""
    from transformers import GenerationConfig

    from orsd.engines.decode import left_padded

    input_ids, attention_mask = left_padded(prompts, pad_id)
    config = GenerationConfig(
        do_sample=not sampling.greedy, temperature=None if sampling.greedy else sampling.temperature,
        top_p=None if sampling.greedy else sampling.top_p, top_k=sampling.top_k, max_new_tokens=sampling.max_new_tokens,
        eos_token_id=stop_ids, pad_token_id=pad_id, no_repeat_ngram_size=sampling.no_repeat_ngram_size or None,
        output_logits=True, return_dict_in_generate=True)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    temperature = 1.0 if sampling.greedy else sampling.temperature
    new = out.sequences[:, input_ids.shape[1]:]
    logprobs = torch.stack([torch.log_softmax(step.float() / temperature, dim=-1).gather(-1, new[:, k:k + 1])[:, 0]
                            for k, step in enumerate(out.logits)], dim=1)
    return new, logprobs
