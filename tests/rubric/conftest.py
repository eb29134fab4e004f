import sys
from pathlib import Path

import pytest

# the shared test helpers (tests/tiny_model.py) live one level up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DATA = Path(__file__).resolve().parents[1] / "data" / "rubric"


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    """One tiny random Qwen3 for the whole session, in place of tests/conftest.py's fresh model per
    test (its tokenizer is tests/conftest.py's)."""
    from tiny_model import make_tiny_qwen3

    return make_tiny_qwen3(tiny_tokenizer)
