"""Suite-wide pytest setup: the `gpu` and `slow` markers; gpu tests skip when CUDA is absent."""

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (skipped when torch.cuda.is_available() is False)"
    )
    config.addinivalue_line("markers", "slow: takes more than ~10 s; still part of the CI run")


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test, restored after: tiny models run fastest so on a busy 2-core
    machine (OpenMP threads spin), and it is not torch's default here, which a test may need."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
