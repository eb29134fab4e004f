"""Rollout engines behind one interface (`RolloutEngine.generate`, `sync_weights`): `hf`
(transformers generate, CPU or GPU) and `vllm` (imported lazily), and the weight sync vLLM needs."""

from orsd.engines.base import Generation, RolloutEngine, Sampling
from orsd.engines.hf import HfEngine

__all__ = ["Generation", "HfEngine", "RolloutEngine", "Sampling"]
