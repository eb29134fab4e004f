"""Fixtures for trainer tests: a tiny random Llama with SmolLM2's real tokenizer, saved as an HF dir
(no download), and this folder's helpers on sys.path (scripted.py, the worker scripts). The tiny
random Qwen3, its tokenizer and SmolLM2's tokenizer are tests/conftest.py's."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_smol_dir(tmp_path_factory, smol_tokenizer):
    """A tiny random Llama with SmolLM2's real tokenizer and chat template, saved as an HF dir so
    `orsd-train` can load it by `model.path` like any checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True, eos_token_id=smol_tokenizer.eos_token_id,
                         pad_token_id=smol_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("tiny-smol")
    LlamaForCausalLM(config).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return path
