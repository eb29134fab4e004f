"""Fixtures for trainer tests: the tiny random Qwen3 and its tokenizer (no download)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from tiny_model import make_tiny_qwen3, make_tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return make_tiny_qwen3(tiny_tokenizer).train()


@pytest.fixture(scope="session")
def smol_tokenizer():
    from orsd.train.model import load_tokenizer

    return load_tokenizer("smollm2-135m")


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
