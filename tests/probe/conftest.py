"""Fixtures for the probe's tests: a tiny random Llama with SmolLM2's real tokenizer and chat
template, saved as an HF dir (what `orsd-probe` loads), and the trainer tests' helpers on sys.path
(scripted.py: the expert-replaying engine). SmolLM2's tokenizer is tests/conftest.py's fixture."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))


@pytest.fixture(scope="session")
def tiny_smol_dir(tmp_path_factory, smol_tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # a wide init: next-token distributions far from uniform, so a spliced rubric moves them visibly
    config = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True, initializer_range=0.2, eos_token_id=smol_tokenizer.eos_token_id,
                         pad_token_id=smol_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("tiny-smol")
    LlamaForCausalLM(config).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_smol(tiny_smol_dir):
    from orsd.train.model import load_policy

    return load_policy(str(tiny_smol_dir), "float32", "cpu").eval()
