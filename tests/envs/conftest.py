"""Fixtures for the env tests: the small generated ALFWorld task set (tests/helpers/alfworld.py's
SIZES), built once per session and shared by the ALFWorld tests."""

import pytest
from helpers.alfworld import SIZES


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One small generated task set per test session (built once, shared by the ALFWorld tests)."""
    pytest.importorskip("alfworld", reason="the [alfworld] extra is not installed")
    from orsd.envs.alfworld import generator as alfworld_generator

    folder = tmp_path_factory.getbasetemp() / "alfworld-cache"
    alfworld_generator.prepare(folder, 0, SIZES, num_workers=2)
    return folder
