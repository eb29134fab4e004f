"""Setup for method tests: tests/train's helpers on sys.path (scripted.py: the scripted engine and
small configs). The tiny random Qwen3 and its tokenizer are tests/conftest.py's fixtures."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
