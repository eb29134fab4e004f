"""Loading a config: the dataclass defaults, then YAML files, then `section.key=value` overrides,
strictly (an unknown key, a wrong type or a value outside its `Allowed` is a `ConfigError` that
says which file and line, or the command line, it came from)."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .rules import ConfigError
from .schema import Config

#: keys renamed by the method/house rework; old configs keep working for one release (with a warning)
RENAMED = {"rubric.mode": "method.name", "verifier.mode": "verifier.granularity"}

#: the embedded default (default.yaml) is the shop's; when the command line moves env.name to
#: another env, that env's file goes on top of it, before the overrides, so that
#: `orsd-train env.name=alfworld` does not run ALFWorld with the shop's options and horizon
ENV_DEFAULTS = {"alfworld": "default_alfworld.yaml"}


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check (and gently convert: int -> float, YAML scalars from the CLI) one value."""
    origin = typing.get_origin(annotation)
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, str):
            return value
        if value is None:
            return ""
    elif annotation is list or origin is list:
        if isinstance(value, list):
            return value
    elif annotation is dict or origin is dict:
        if isinstance(value, dict):
            return value
    elif isinstance(annotation, types.UnionType):
        return value
    raise ConfigError(f"{key}={value!r} has the wrong type: expected {getattr(annotation, '__name__', annotation)}",
                      key=key)


def _rename_legacy(layer: _Layer) -> dict:
    """Move keys listed in RENAMED to their new place, with a warning naming both and where the old
    one was written. Called by load_config only: stacklevel 3 points the warning at its caller.
    An error about the new key then names the old one and where it was written (a file's line or
    the command line), not where the new key last had a value (the embedded default)."""
    import warnings

    data = layer.data
    for old, new in RENAMED.items():
        section, key = old.split(".")
        if isinstance(data.get(section), dict) and key in data[section]:
            value = data[section].pop(key)
            written = layer.lines.get(old, layer.where)
            layer.lines[new] = f"{written}, key {old!r} (now {new!r})"
            warnings.warn(f"{written}: config key {old!r} is now {new!r}; "
                          f"the old name is read for one release", FutureWarning, stacklevel=3)
            new_section, new_key = new.split(".")
            data.setdefault(new_section, {})[new_key] = value
    return data


def _merge(obj: Any, data: dict, prefix: str = "") -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'the config'} must be a mapping of keys, got {data!r}",
                          key=prefix.rstrip(".") or None)
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r}; known keys here: {sorted(names)}", key=dotted)
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _merge(current, value, dotted + ".")
        else:
            setattr(obj, key, _coerce(dotted, value, hints[key]))


@dataclass
class _Layer:
    """One source of values: a YAML file or one command-line override, with where each key came from."""

    data: Any
    lines: dict[str, str]  # dotted key -> "file:line" ("" = the document itself)
    where: str  # for errors not tied to a key


class _YamlProblem(Exception):
    def __init__(self, line: int | None, what: str):
        super().__init__(what)
        self.line, self.what = line, what


def _refuse_repeated_keys(node, prefix: str) -> None:
    """A key written twice in one mapping is refused with both lines: YAML keeps the last one
    silently, so a file that sets optim.lr at the top and again lower down trains with the second.
    Runs on the composed nodes, before `<<` merges add their keys (an explicit key may override
    a merged one)."""
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_repeated_keys(item, prefix)
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[str, int] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        line = key_node.start_mark.line + 1
        dotted = prefix + key_node.value
        if key_node.value in first:
            raise _YamlProblem(line, f"key {dotted!r} is written twice, on lines {first[key_node.value]} and {line} "
                               f"(YAML would keep the last silently); keep one")
        first[key_node.value] = line
        _refuse_repeated_keys(value_node, dotted + ".")


def _parse_yaml(text: str) -> tuple[Any, dict[str, int]]:
    """safe_load, plus the 1-based line of every mapping key (dotted); any YAML problem becomes a
    _YamlProblem with its line. Python tags (!!python/object...) are refused by the safe loader."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # the reader refuses NUL and other control characters here
        node = loader.get_single_node()
        _refuse_repeated_keys(node, "")  # before construction, which would keep the last silently
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        what = " ".join(part for part in (error.problem, f"({error.context})" if error.context else None) if part)
        if "\\t" in what or "\t" in what:
            what += "; YAML indents with spaces, not tabs"
        raise _YamlProblem(mark.line + 1 if mark else None, what or str(error).splitlines()[0]) from None
    except yaml.reader.ReaderError as error:
        code = error.character if isinstance(error.character, int) else ord(error.character)
        raise _YamlProblem(text.count("\n", 0, max(error.position, 0)) + 1,
                           f"control character U+{code:04X} is not allowed in YAML text (a binary file?)") from None
    except yaml.YAMLError as error:
        raise _YamlProblem(None, " ".join(str(error).split())) from None
    except RecursionError:
        raise _YamlProblem(None, "nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[str, int] = {"": node.start_mark.line + 1} if node is not None else {}

    def walk(node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    lines[prefix + key_node.value] = key_node.start_mark.line + 1
                    walk(value_node, prefix + key_node.value + ".")

    walk(node, "")
    return data, lines


def _file_layer(path: str | Path) -> _Layer:
    """A YAML config file; every way it can fail to be one is a ConfigError '<file>[:line]: what'."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a YAML file") from None
    except OSError as error:
        raise ConfigError(f"{name}: cannot be read ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"{name}:{line}: byte 0x{raw[error.start]:02x} is not UTF-8 text "
                          f"(a binary file?)") from None
    return _text_layer(text, name)


def _text_layer(text: str, name: str) -> _Layer:
    try:
        data, lines = _parse_yaml(text)
    except _YamlProblem as problem:
        raise ConfigError(f"{name}:{problem.line}: {problem.what}" if problem.line else f"{name}: {problem.what}")
    if data is None:
        data = {}  # an empty file (or only comments) changes nothing
    return _Layer(data, {key: f"{name}:{line}" for key, line in lines.items()}, f"{name}:{lines.get('', 1)}")


def _override_layer(item: str) -> _Layer:
    """`section.key=value` from the command line; the value is read as YAML (`[0.8, 0.9]`, `{a: 1}`)."""
    where = "command line"
    if "=" not in item:
        raise ConfigError(f"{where}: override {item!r} must look like section.key=value")
    dotted, raw = item.split("=", 1)
    parts = dotted.strip().split(".")
    if not all(part.strip() for part in parts):
        raise ConfigError(f"{where}: override {item!r}: {dotted!r} is not a dotted key like section.key")
    try:
        value = _parse_yaml(raw)[0] if raw.strip() else ""
    except _YamlProblem as problem:
        raise ConfigError(f"{where}: override {item!r}: the value is not YAML: {problem.what}") from None
    nested: dict = {}
    cursor = nested
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = value
    return _Layer(nested, {".".join(parts[:i]): where for i in range(1, len(parts) + 1)}, where)


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: str | Path | None = None) -> Config:
    """The dataclass defaults (the paper's values), then `base` (a run's own config.yaml, on resume),
    then the YAML file at `path` — the embedded CPU default when neither file is given — then
    `section.key=value` overrides. Every error is a ConfigError that says where the value came from."""
    config = Config()
    layers = [_file_layer(base)] if base is not None else []
    commands = [_override_layer(item) for item in overrides]
    if path is not None:
        layers.append(_file_layer(path))
    elif base is None:
        layers.append(_text_layer(default_yaml(), "orsd/train/default.yaml"))
        env_default = ENV_DEFAULTS.get(_env_name(commands))
        if env_default:
            layers.append(_text_layer(default_yaml(env_default), f"orsd/train/{env_default}"))
    layers += commands
    origin: dict[str, str] = {}
    for layer in layers:
        data = _rename_legacy(layer) if isinstance(layer.data, dict) else layer.data
        try:
            _merge(config, data)
        except ConfigError as error:
            raise error.at(layer.lines.get(error.key or "", layer.where)) from None
        origin.update(layer.lines)
    try:
        return config.validate()
    except ConfigError as error:
        raise error.at(origin.get(error.key)) from None


def _env_name(commands: list[_Layer]) -> str | None:
    """env.name as the command line leaves it (env.name=x or env={name: x}; the last one wins)."""
    name = None
    for layer in commands:
        env = layer.data.get("env") if isinstance(layer.data, dict) else None
        if isinstance(env, dict) and isinstance(env.get("name"), str):
            name = env["name"]
    return name


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def default_yaml(name: str = "default.yaml") -> str:
    """What `orsd-train` runs with no arguments: the embedded CPU default (orsd/train/default.yaml),
    or the file of ENV_DEFAULTS laid over it for another env."""
    from importlib import resources

    return resources.files("orsd.train").joinpath(name).read_text()
