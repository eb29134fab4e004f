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
