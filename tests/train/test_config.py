"""Config loading: strict keys and types, dot-path overrides, the embedded default, --dry-run."""

from pathlib import Path

import pytest
import yaml

from orsd.train.cli import main
from orsd.train.config import Config, ConfigError, field_docs, load_config, to_yaml


def test_embedded_default_is_the_cpu_run():
    config = load_config()
    assert config.model.path == "smollm2-135m"
    assert config.env.name == "webshop"
    assert config.warm_start.enabled
    assert config.method.name == "orsd"


def test_file_layers_on_paper_defaults_not_on_the_cpu_default(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env: {name: alfworld}\n")
    config = load_config(path)
    assert config.env.name == "alfworld"
    assert config.rollout.group_size == Config().rollout.group_size == 8  # paper value, not the default run's
    assert not config.warm_start.enabled


def test_overrides_parse_yaml_values():
    config = load_config(None, ["rubric.num_bundles=2", "rubric.alpha=0.05", "method.name=grpo",
                                "optim.betas=[0.8, 0.9]", "env.options={foo: 1}"])
    assert config.rubric.num_bundles == 2 and config.rubric.alpha == 0.05 and config.method.name == "grpo"
    assert config.optim.betas == [0.8, 0.9] and config.env.options == {"foo": 1}


def test_int_is_accepted_for_float():
    assert load_config(None, ["optim.lr=1"]).optim.lr == 1.0


@pytest.mark.parametrize("override, named", [
    ("rubric.num_bundle=2", "rubric.num_bundle"),
    ("nosection.x=1", "nosection"),
    ("rubric.num_bundles=two", "rubric.num_bundles"),
    ("train.progress=3", "train.progress"),
    ("method.name=ppo", "method.name"),
    ("optim.old_logprobs=sampler", "optim.old_logprobs"),
    ("optim.micro_batch_size=-1", "optim.micro_batch_size"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("rubric=3", "rubric"),
    ("verifier.kind=openai", "verifier.base_url"),
])
def test_bad_keys_and_values_name_the_key(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, [override])


def test_renamed_keys_are_read_for_one_release_with_a_warning(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("rubric: {mode: grpo}\nverifier: {mode: per_group}\n")
    with pytest.warns(FutureWarning, match="rubric.mode.*method.name"):
        config = load_config(path, ["rubric.mode=random_bundle"])
    assert config.method.name == "random_bundle" and config.verifier.granularity == "per_group"


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["rubric.alpha"])


def test_dry_run_prints_resolved_config(capsys):
    assert main(["--dry-run", "rubric.num_bundles=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rubric"]["num_bundles"] == 3
    assert printed["model"]["path"] == "smollm2-135m"


def test_dry_run_reports_bad_key(capsys):
    assert main(["--dry-run", "rubric.bogus=1"]) == 2
    assert "rubric.bogus" in capsys.readouterr().err


def test_every_field_is_documented():
    rows = field_docs()
    assert len(rows) > 50
    missing = [key for key, _, _, help_text in rows if not help_text.strip()]
    assert not missing


def test_yaml_round_trip(tmp_path):
    config = load_config(None, ["train.steps=7"])
    path = tmp_path / "resolved.yaml"
    path.write_text(to_yaml(config))
    assert load_config(path) == config


def test_docs_config_md_is_generated_from_the_dataclasses():
    from orsd.train.config import config_markdown

    path = Path(__file__).parents[2] / "docs" / "config.md"
    assert path.read_text() == config_markdown(), "regenerate: python -m orsd.train.config > docs/config.md"


PRESETS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_passes_dry_run(preset, capsys):
    assert main(["--config", str(preset), "--dry-run"]) == 0, capsys.readouterr().err
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == yaml.safe_load(to_yaml(load_config(preset)))


@pytest.mark.parametrize("preset", [p for p in PRESETS if "qwen3" in p.stem and "smoke" not in p.stem],
                         ids=lambda p: p.stem)
def test_paper_presets_hold_the_papers_settings(preset):
    """Tables 4/5: 8 tasks x 8 rollouts, 300 steps, lr 1e-6, no warm start, a GRPO twin."""
    config = load_config(preset)
    assert (config.rollout.tasks_per_step, config.rollout.group_size) == (8, 8)
    assert config.train.steps == 300 and config.optim.lr == 1e-6 and not config.warm_start.enabled
    assert config.env.name in preset.stem
    assert config.model.path == ("Qwen/Qwen3-4B" if "_4b_" in preset.stem else "Qwen/Qwen3-1.7B")
    assert config.method.name == ("grpo" if preset.stem.endswith("grpo") else "orsd")
    # Table 4's micro-batch (samples per GPU: WebShop 1, ALFWorld 2) and App. C.2's π_old
    assert config.optim.micro_batch_size == (1 if config.env.name == "webshop" else 2)
    assert config.optim.old_logprobs == "rollout"
    twin = preset.with_name(preset.stem.rsplit("_", 1)[0] + ("_orsd" if preset.stem.endswith("grpo") else "_grpo") + ".yaml")
    assert twin.exists()
