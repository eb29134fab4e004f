"""Fixtures for method tests: the tiny random Qwen3 of tests/train, and its helpers on sys.path
(scripted.py: the scripted engine and small configs)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))

from tiny_model import make_tiny_qwen3, make_tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return make_tiny_qwen3(tiny_tokenizer).train()
