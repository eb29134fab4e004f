"""Config loading: strict keys and types, allowed values for every key, one-line errors with
file:line for bad files, dot-path overrides, the embedded default, --dry-run."""

import json
import math
import re
import socket
import time
from pathlib import Path

import pytest
import yaml

from orsd.train import cli
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
                                "optim.betas=[0.8, 0.9]", "env.options={results_per_page: 6}"])
    assert config.rubric.num_bundles == 2 and config.rubric.alpha == 0.05 and config.method.name == "grpo"
    assert config.optim.betas == [0.8, 0.9] and config.env.options == {"results_per_page": 6}


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
    ("rollout.group_size=1", "rollout.group_size"),  # a group of one has zero advantage
    ("rubric=3", "rubric"),
    ("verifier.kind=openai", "verifier.base_url"),
])
def test_bad_keys_and_values_name_the_key(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, [override])


def test_renamed_keys_are_read_for_one_release_with_a_warning(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("rubric: {mode: grpo}\nverifier: {mode: per_group}\n")
    # no match= here: pytest re-raises the caught warnings that do not match, and both renames warn
    with pytest.warns(FutureWarning) as caught:
        config = load_config(path, ["rubric.mode=random_bundle"])
    assert config.method.name == "random_bundle" and config.verifier.granularity == "per_group"
    renames = sorted(str(w.message).split("config key ")[1] for w in caught)
    assert [r.split(";")[0] for r in renames] == [
        "'rubric.mode' is now 'method.name'", "'rubric.mode' is now 'method.name'",
        "'verifier.mode' is now 'verifier.granularity'"]
    # each warning says where the old name was written, and points at the caller of load_config
    assert sorted(str(w.message).split(": config key")[0] for w in caught) == [
        f"{path}:1", f"{path}:2", "command line"]
    assert {w.filename for w in caught} == {__file__}


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
    missing = [row.key for row in rows if not row.help.strip()]
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


#: presets named for the paper's row they reproduce, not for their method (docs/methods.md)
REPRODUCES = {"sdar_opsd": "opsd", "sdar_grpo_opsd": "grpo_opsd"}


PAPER_PRESETS = [p for p in PRESETS if "qwen3" in p.stem and "smoke" not in p.stem and not p.stem.endswith("_lora")]


@pytest.mark.parametrize("preset", PAPER_PRESETS, ids=lambda p: p.stem)
def test_paper_presets_hold_the_papers_settings(preset):
    """Tables 4/5: 8 tasks x 8 rollouts, 300 steps, lr 1e-6, no warm start; every method's preset is a
    twin of the ORSD one that differs only in `method`."""
    config = load_config(preset)
    assert (config.rollout.tasks_per_step, config.rollout.group_size) == (8, 8)
    assert config.train.steps == 300 and config.optim.lr == 1e-6 and not config.warm_start.enabled
    assert config.env.name in preset.stem
    assert config.model.path == ("Qwen/Qwen3-4B" if "_4b_" in preset.stem else "Qwen/Qwen3-1.7B")
    size = "_4b_" if "_4b_" in preset.stem else "_1p7b_"
    method = preset.stem.split(size, 1)[1]
    assert config.method.name == REPRODUCES.get(method, method)
    # Table 4's micro-batch (samples per GPU: WebShop 1, ALFWorld 2) and App. C.2's π_old
    assert config.optim.micro_batch_size == (1 if config.env.name == "webshop" else 2)
    assert config.optim.old_logprobs == "rollout"
    base = preset.with_name(preset.stem.split(size, 1)[0] + size + "orsd.yaml")
    twin = load_config(base)
    assert twin.method.name == "orsd"
    for section in ("model", "env", "rollout", "rubric", "verifier", "optim", "replay", "distributed", "warm_start"):
        assert getattr(config, section) == getattr(twin, section), section  # only the method differs
    assert preset.with_name(base.name.replace("_orsd", "_grpo")).exists()  # every ORSD preset has a GRPO twin


@pytest.mark.parametrize("preset", PAPER_PRESETS, ids=lambda p: p.stem)
def test_every_paper_preset_has_a_lora_twin_that_differs_only_where_its_header_says(preset):
    """configs/<preset>_lora.yaml (one 24-48 GB GPU, docs/scale.md): rank-16 adapters, alpha 32, on every
    linear layer, and 10x the paper's lr; every other key, the run's name aside, is the paper preset's."""
    paper, lora = load_config(preset), load_config(preset.with_name(preset.stem + "_lora.yaml"))
    assert (lora.model.lora.rank, lora.model.lora.alpha, lora.model.lora.dropout) == (16, 32.0, 0.0)
    assert lora.model.lora.target_modules == [] and paper.model.lora.rank == 0
    assert lora.optim.lr == pytest.approx(10 * paper.optim.lr)
    assert lora.train.run_name == paper.train.run_name + "_lora"
    lora.model.lora, lora.optim.lr, lora.train.run_name = paper.model.lora, paper.optim.lr, paper.train.run_name
    assert lora == paper


def test_every_lora_preset_is_a_paper_presets_twin():
    assert {p.stem for p in PRESETS if p.stem.endswith("_lora")} == {p.stem + "_lora" for p in PAPER_PRESETS}


# -- allowed values: every key -------------------------------------------------------------------

#: a refused value for each key whose rule is a pattern or a rule in words (cross-field, files);
#: keys with choices or bounds get theirs generated from the rule below
BAD_BY_KEY = {
    "model.path": [""],
    "model.device": ["tpu", "cuda:", "cuda:x"],
    "env.split": ["bogus", "valid_seen"],  # valid_seen is ALFWorld's, not the shop's
    "env.eval_split": ["bogus"],
    "env.options": [{1: "x"}],
    "rubric.generation_template": ["/no/such/template.txt"],
    "rubric.context_template": ["/no/such/template.txt"],
    "method.rubric_file": ["/no/such/rubric.yaml"],
    "verifier.base_url": ["notaurl", "ftp://host/v1", "http://", "http://host:99999/v1", "http://u:pw@host/v1"],
    "verifier.model": [],  # refused only together with an openai endpoint: see EXTRA_OVERRIDES
    "verifier.api_key_env": ["sk-0123456789abcdef", "MY KEY"],
    "verifier.cache_dir": [__file__],  # a file, not a directory
    "train.run_name": ["../outside", "", ".hidden", "a/b"],
    "optim.dual_clip": [0.5],  # 0 (off) or > 1
}
#: settings refused only together (cross-field rules), on top of the embedded default
EXTRA_OVERRIDES = {
    "verifier.model": ["verifier.base_url=http://localhost:8000/v1", "verifier.model="],
    "verifier.base_url": ["verifier.kind=openai"],
    "rubric.no_repeat_ngram_size": ["rollout.engine=vllm"],  # the default run bans 4-grams: hf only
    "rubric.draft_tokens": ["rollout.engine=vllm", "rubric.no_repeat_ngram_size=0"],  # the default drafts: hf only
    "distributed.zero_stage": ["distributed.zero_stage=3"],  # with rollout.engine=hf
    "rollout.max_context_tokens": ["rollout.max_new_tokens=512", "rollout.max_context_tokens=512"],
    "warm_start.detach_context": ["model.gradient_checkpointing=true"],  # the default fits detached
}


def as_yaml(value) -> str:
    """`value` as a YAML flow scalar for an override (JSON, plus YAML's spelling of NaN and infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if value != value else ".inf" if value > 0 else "-.inf"
    if isinstance(value, list):
        return "[" + ", ".join(as_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{as_yaml(k)}: {as_yaml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def bad_values(row) -> list:
    """Values the declared rule of `row` refuses: just past each bound, a non-choice, non-finite
    numbers, a list of the wrong length."""
    rule, integer = row.rule, row.type == "int"
    values = list(BAD_BY_KEY.get(row.key, []))
    if rule.choices:
        values.append(99 if integer else "not-a-choice")
    step = 1 if integer else 1e-3
    for bound, outside in ((rule.ge, -step), (rule.gt, 0), (rule.le, step), (rule.lt, 0)):
        if bound is not None:
            values.append(int(bound + outside) if integer else bound + outside)
    if row.type == "float" or row.type == "list":
        values += [float("nan"), float("inf"), float("-inf")]
    if row.type == "list":
        values = [[value, 0.5] for value in values] + [[0.5], [0.5, 0.5, 0.5]]
    return values


WRONG_TYPE = {"bool": "maybe", "int": "many", "float": "lots", "str": [1], "list": "x", "dict": 3}
CASES = [(row.key, value) for row in field_docs() for value in bad_values(row)]


def test_every_field_declares_its_allowed_values():
    undeclared = [row.key for row in field_docs() if row.type != "bool" and not row.rule.declared]
    assert not undeclared, "declare choices/bounds/pattern/text with doc(...)"
    uncovered = [row.key for row in field_docs() if row.rule.declared and not bad_values(row)
                 and row.key not in EXTRA_OVERRIDES]
    assert not uncovered, "add a refused value to BAD_BY_KEY"


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}={v!r}" for k, v in CASES])
def test_a_value_outside_the_declared_rule_is_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as raised:
        load_config(None, [f"{key}={as_yaml(value)}"])
    assert raised.value.key == key and f"{key}=" in str(raised.value), str(raised.value)
    assert "is invalid: expected" in str(raised.value)


@pytest.mark.parametrize("key", sorted(EXTRA_OVERRIDES))
def test_cross_field_rules_name_the_key(key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(None, EXTRA_OVERRIDES[key])


@pytest.mark.parametrize("row", field_docs(), ids=lambda row: row.key)
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(row):
    with pytest.raises(ConfigError, match=re.escape(row.key) + ".*wrong type"):
        load_config(None, [f"{row.key}={as_yaml(WRONG_TYPE[row.type])}"])


def test_the_defaults_and_every_boundary_value_are_accepted():
    load_config(None, ["optim.betas=[0.0, 0.999999]", "rubric.alpha=0", "optim.kl_coef=0", "optim.lr=0",
                       "rollout.top_p=1", "train.save_every=0", "train.keep_checkpoints=0", "model.device=cuda:3",
                       "verifier.api_key_env=MY_KEY_1", "verifier.base_url=https://api.example.com:8443/v1",
                       "verifier.model=judge", "env.name=alfworld", "env.split=valid_seen", "train.seed=4294967295"])
    Config().validate()


def test_a_rejected_api_key_env_is_not_echoed():
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["verifier.api_key_env=sk-secret-0123456789"])
    assert "sk-secret" not in str(raised.value) and "verifier.api_key_env" in str(raised.value)


def test_a_password_in_base_url_is_masked_in_the_error():
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["verifier.base_url=http://user:hunter2@host/v1"])
    assert "hunter2" not in str(raised.value) and "api_key_env" in str(raised.value)


def test_transcript_floor_is_the_rubric_packages():
    from orsd.rubric.transcript import MIN_TRANSCRIPT_CHARS

    rule = next(row.rule for row in field_docs() if row.key == "rubric.transcript_chars")
    assert rule.ge == MIN_TRANSCRIPT_CHARS


#: the values found accepted in issue 12 (and their near relatives): each must stop at load
ISSUE_12 = ["rubric.alpha=.nan", "rubric.alpha=.inf", "rubric.alpha=-.inf", "rubric.alpha=-0.01", "optim.lr=.inf",
            "optim.lr=.nan", "optim.lr=-1e-6", "optim.kl_coef=.nan", "optim.kl_coef=-0.001",
            "verifier.concurrency=0", "verifier.timeout_seconds=0", "verifier.timeout_seconds=.inf",
            "rollout.batch_size=0", "rollout.max_context_tokens=-1", "rollout.max_new_tokens=0", "env.split=bogus",
            "model.device=tpu", "verifier.base_url=notaurl", "optim.betas=[1.0, 0.999]", "optim.betas=[0.9, -0.1]",
            "train.keep_checkpoints=-1", "train.save_every=-1", "optim.weight_decay=-0.01"]


@pytest.mark.parametrize("override", ISSUE_12)
def test_issue_12_values_are_one_line_errors_with_exit_code_2(override, capsys):
    assert main(["--dry-run", override]) == 2
    captured = capsys.readouterr()
    key = override.split("=")[0]
    assert captured.out == ""
    assert re.fullmatch(rf"orsd-train: config error: command line: {re.escape(key)}=.* is invalid: expected .+\n",
                        captured.err), captured.err


def test_a_bad_value_in_a_file_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  name: webshop\nrubric:\n  num_bundles: 2\n  alpha: .nan\n")
    assert main(["--config", str(path), "--dry-run"]) == 2
    assert capsys.readouterr().err == (f"orsd-train: config error: {path}:5: rubric.alpha=nan is invalid: "
                                       f"expected a finite number >= 0\n")


# -- bad files and overrides: one line with file:line, exit code 2, never a traceback ---------------

BAD_FILES = {
    "unclosed bracket": (b"rubric: {alpha: [0.1\n", r":2: expected ',' or '\]'"),
    "bad indent": (b"rubric:\n  alpha: 0.1\n num_bundles: 2\n", r":3: expected <block end>"),
    "tab": (b"rubric:\n\talpha: 0.1\n", r":2: found character '\\t'.*spaces, not tabs"),
    "python tag": (b"rubric: !!python/object/apply:os.system ['echo owned']\n",
                   r":1: could not determine a constructor"),
    "binary file": (bytes(range(256)) * 4, r":2: byte 0x80 is not UTF-8 text \(a binary file\?\)"),
    "control characters": (b"rubric:\n  alpha: 0.1\x00\x01\n", r":2: control character U\+0000"),
    "directory": (None, r": is a directory"),
    "missing file": (..., r": no such file"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
@pytest.mark.parametrize("program", ["orsd-train", "orsd-eval"])
def test_a_bad_config_file_is_one_line_with_file_and_line(case, program, tmp_path, capsys):
    content, expected = BAD_FILES[case]
    path = tmp_path / "bad.yaml"
    if content is None:
        path.mkdir()
    elif content is not ...:
        path.write_bytes(content)
    if program == "orsd-train":
        assert main(["--config", str(path), "--dry-run"]) == 2
    else:
        assert cli.eval_main([str(tmp_path / "no-checkpoint"), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.match(rf"{program}: config error: {re.escape(str(path))}{expected}", err), err


@pytest.mark.parametrize("override, expected", [
    ("rubric.alpha", "must look like section.key=value"),
    ("rubric.alpha=[0.1", "the value is not YAML"),
    ("=0.1", "is not a dotted key"),
    ("rubric..alpha=0.1", "is not a dotted key"),
    ("rubric.alpha=!!python/name:os.system", "could not determine a constructor"),
])
def test_a_malformed_override_is_one_line(override, expected, capsys):
    assert main(["--dry-run", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("orsd-train: config error: command line: ") and expected in err


# -- the verifier endpoint: syntax at load, reachability before training ----------------------------

def openai_config(url: str, *more: str):
    return load_config(None, ["verifier.kind=openai", f"verifier.base_url={url}", "verifier.model=judge", *more])


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once closed


def reachable(config, **kwargs) -> None:
    """cli.check_verifier_reachable as `run` calls it: with whether the config's method calls the verifier."""
    from orsd.methods import make_method

    cli.check_verifier_reachable(config, make_method(config).calls_verifier, **kwargs)


def test_an_unreachable_verifier_stops_the_run_before_training():
    config = openai_config(f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(cli.RunError, match="unreachable.*verifier.check_reachable=false"):
        reachable(config)


def test_the_reachability_probe_is_bounded_and_skippable(monkeypatch):
    def hangs(*args, **kwargs):  # a connect that never answers, then times out as a real one would
        time.sleep(30)  # (returning None instead made the probe thread raise 30 s later, in another test)
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", hangs)
    start = time.monotonic()
    with pytest.raises(cli.RunError, match="no connection within 0.2 s"):
        reachable(openai_config("http://judge.invalid:8000/v1"), seconds=0.2)
    assert time.monotonic() - start < 2
    reachable(openai_config("http://judge.invalid:8000/v1", "verifier.check_reachable=false"))
    reachable(openai_config("http://judge.invalid:8000/v1", "method.name=grpo"))  # never asked


def test_a_listening_verifier_passes_and_dry_run_never_probes(monkeypatch, capsys):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        reachable(openai_config(f"http://127.0.0.1:{server.getsockname()[1]}/v1"))
    monkeypatch.setattr(cli, "check_verifier_reachable", lambda *a, **k: pytest.fail("probed in --dry-run"))
    assert main(["--dry-run", "verifier.kind=openai", f"verifier.base_url=http://127.0.0.1:{closed_port()}/v1",
                 "verifier.model=judge"]) == 0
