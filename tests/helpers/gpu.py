"""The `gpu` marker as tests/ and benchmarks/ both register it: its description, and the skip of
every gpu item when CUDA is absent (torch is imported only when a gpu item was collected)."""

from __future__ import annotations

import pytest

GPU_MARKER = "gpu: needs a CUDA device (skipped when torch.cuda.is_available() is False)"


def skip_gpu_items_without_cuda(items) -> None:
    """pytest_collection_modifyitems' body: mark every `gpu` item skipped unless CUDA is available."""
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
