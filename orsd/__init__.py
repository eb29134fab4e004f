"""orsd: GRPO + Online Rubric Self-Distillation (arXiv 2611.06543) for multi-turn LLM agents."""

__version__ = "0.1.0"
