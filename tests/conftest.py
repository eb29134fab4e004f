"""Suite-wide pytest setup: the `gpu` and `slow` markers (gpu tests skip when CUDA is absent), and the
fixtures every test folder shares: one torch thread, the tiny random Qwen3 and its tokenizer
(tests/tiny_model.py, no download), SmolLM2's real tokenizer."""

import pytest
from helpers.gpu import GPU_MARKER, skip_gpu_items_without_cuda


def pytest_configure(config):
    config.addinivalue_line("markers", GPU_MARKER)
    config.addinivalue_line("markers", "slow: takes more than ~10 s; still part of the CI run")


def pytest_collection_modifyitems(config, items):
    skip_gpu_items_without_cuda(items)


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test, restored after: tiny models run fastest so on a busy 2-core
    machine (OpenMP threads spin), and it is not torch's default here, which a test may need."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tiny_model import make_tiny_tokenizer

    return make_tiny_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):
    """A fresh tiny random Qwen3 per test, in train mode."""
    from tiny_model import make_tiny_qwen3

    return make_tiny_qwen3(tiny_tokenizer).train()


@pytest.fixture(scope="session")
def smol_tokenizer():
    from orsd.train.model import load_tokenizer

    return load_tokenizer("smollm2-135m")
