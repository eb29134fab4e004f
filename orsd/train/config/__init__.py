"""Typed run configuration: dataclasses that mirror the YAML one-to-one.

Every field carries its documentation and its allowed values next to its default (`doc`);
`orsd-train --help-config` and docs/config.md are generated from them, so the three never drift
apart. Loading is strict: an unknown key, a value of the wrong type, out of range, not finite or not
one of the choices is a `ConfigError` naming the dotted key, the value and what is allowed; a file
that is not readable YAML is a `ConfigError` naming the file and line.

One room, four parts: `rules` (what a value may be, and the error), `schema` (the sections and
their cross-field rules), `loading` (defaults, files and overrides, in that order) and `reference`
(the generated docs). Import from here.
"""

from .loading import RENAMED, default_yaml, load_config, to_dict, to_yaml
from .reference import FieldDoc, config_markdown, field_docs, resumable_keys
from .rules import SEED, Allowed, ConfigError, doc
from .schema import (Config, DistributedConfig, EnvConfig, MethodConfig, ModelConfig, OptimConfig, ReplayConfig,
                     RolloutConfig, RubricConfig, TrainConfig, VerifierConfig, WarmStartConfig, method_names)

__all__ = [
    "RENAMED", "SEED", "Allowed", "Config", "ConfigError", "DistributedConfig", "EnvConfig", "FieldDoc",
    "MethodConfig", "ModelConfig", "OptimConfig", "ReplayConfig", "RolloutConfig", "RubricConfig",
    "TrainConfig", "VerifierConfig", "WarmStartConfig", "config_markdown", "default_yaml", "doc",
    "field_docs", "load_config", "method_names", "resumable_keys", "to_dict", "to_yaml",
]
