"""`python -m orsd.train.config > docs/config.md`: the configuration reference, generated."""

from .reference import config_markdown

print(config_markdown(), end="")
