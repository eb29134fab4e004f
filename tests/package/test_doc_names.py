"""Every page of docs/ names only what exists. Each span in single backticks is classified:

- a path in the repository, a file a run writes (a string in orsd/), a console script, a config key
  (`section.key`, also as `section.key=value` or `section.key: value`), a dependency direction
  (`train → methods`), or a Python name defined in orsd/ (a module, class, function, method,
  attribute or field), dotted names resolved member by member; names outside orsd are imported
  and looked up (vLLM's and DeepSpeed's, too heavy to import, must be names orsd's code uses);
- a value: a number, a quoted string, a literal list or mapping, a word that orsd's code holds as a
  string (`bfloat16`, `content_free`), an environment variable orsd or its build reads;
- a command: a span that starts with a console script, a known program or a flag; its config
  overrides must name keys, its paths must exist, `git show COMMIT:PATH` must find the file there;
- a formula (operators, `=` between spaces, math signs): its calls must name functions that exist;
- a literal the code holds verbatim (a tag such as `<think>`, a placeholder such as `{task}`).

Anything else is prose that should not be in backticks. Issue 58 found seven claims of
docs/architecture.md that the code contradicted; issue 68 extended the check to every page."""

import ast
import builtins
import dataclasses
import importlib
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from orsd.train.config import Config

ROOT = Path(__file__).parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
SOURCE = ROOT / "orsd"
#: where a relative path in the docs may start
BASES = [ROOT, SOURCE, SOURCE / "train", SOURCE / "engines", SOURCE / "envs", ROOT / "csrc", ROOT / "docs"]
#: files a run writes (checked to appear as a string in orsd/, where they are written)
RUN_FILE = re.compile(r"^[\w.-]+\.(jsonl|json|yaml|png|html)$")
PATH = re.compile(r"^[\w./-]*(/[\w.-]*|\.(py|h|cpp|cu|cuh|md|txt|sh|yaml|json|jsonl|toml|cfg))$")
CALLED = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\(")
NAME = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
NUMBER = re.compile(r"[-+−]?(\d[\d,_]*)(\.\d*)?([eE][-+−]?\d+)?(\*\*\d+)?")
ENV_VAR = re.compile(r"[A-Z][A-Z0-9_]+")
PLACEHOLDER = re.compile(r"<[^<>]+>|\{[^{}]*\}|\*|…|\.\.\.")
FORMULA = re.compile(r"[·−Σ≤≥√±×∈→^|@]| [=+*/<>] | [<>]= |==| // |\[.*[:,].*\]")
JSON_WORDS = {"null", "true", "false", "NaN", "Infinity", "-Infinity"}
#: fenced blocks of a page: commands whose labels (arms, run directories) the page then cites
FENCED = re.compile(r"```.*?```|^(?:    .*\n?)+", re.S | re.M)
#: programs a command span may start with, besides the console scripts
PROGRAMS = {"python", "python3", "pytest", "bash", "pip", "torchrun", "deepspeed", "vllm", "tensorboard",
            "git", "docker", "ssh", "cmake", "make", "nvcc", "taskset", "export", "tar", "OMP_NUM_THREADS=1"}
#: packages too heavy to import here (or with side effects on import): their names must be ones orsd uses
HEAVY = {"vllm", "deepspeed"}
#: packages whose names are looked up by importing them
EXTERNAL = {"torch", "dataclasses", "numpy", "scipy", "statsmodels", "rliable", "transformers", "peft",
            "asyncio", "httpx", "matplotlib", "hypothesis", "safetensors", "json", "os", "gc", "copy",
            "threading", "random", "math", "sys", "functools", "contextlib", "pathlib", "subprocess", "itertools"}


def console_scripts() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, flags=re.M))


def backticked(text: str) -> list[str]:
    """Single-backtick spans outside fenced blocks; a span may continue on the next line."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def definitions() -> tuple[dict[str, set[str]], set[str], set[str], dict[str, set[str]]]:
    """members[owner]: names defined in module or class `owner` (by its last name; a package also
    holds what its __init__ imports), every name defined anywhere in orsd/, every identifier orsd/
    uses (names, attributes, imports), and each class's own members."""
    members: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    everything: set[str] = set()
    used: set[str] = set()
    for path in [*SOURCE.rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:  # benchmarks: `cost_model.Setting`
        module = path.parent.name if path.name == "__init__.py" else path.stem
        tree = ast.parse(path.read_text())
        names = members.setdefault(module, set())
        everything.add(module)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                everything.add(node.name)
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.keyword) and node.arg:
                used.add(node.arg)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                used.update(part for a in node.names for part in a.name.split("."))
                used.update((node.module or "").split(".") if isinstance(node, ast.ImportFrom) else ())
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                used.add(node.value)  # a name looked up by string: collective_rpc("orsd_receive")
            if isinstance(node, ast.ClassDef):
                owned = members.setdefault(node.name, set())
                classes[node.name] = owned
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        owned.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        owned.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        owned.update(t.id for t in item.targets if isinstance(t, ast.Name))
                    elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        owned.add(item.attr)  # self.x = ... in a method
                everything.update(owned)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
        everything.update(names)
    for package in [SOURCE, *(d for d in SOURCE.rglob("*") if d.is_dir() and any(d.glob("*.py")))]:
        inner = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
        inner |= {d.name for d in package.iterdir() if d.is_dir() and any(d.glob("*.py"))}
        members.setdefault(package.name, set()).update(inner)  # a package holds its modules
        everything.update(inner)
    return members, everything, used, classes


MEMBERS, EVERYTHING, USED, CLASSES = definitions()
RUN_STRINGS = "\n".join(p.read_text() for p in SOURCE.rglob("*.py"))
#: everything orsd's code and data hold as text (sources, prompt templates, YAML)
LITERALS = RUN_STRINGS + "\n".join(p.read_text() for pattern in ("*.txt", "*.yaml") for p in SOURCE.rglob(pattern))
#: the native code and its build
NATIVE_TEXT = "\n".join(p.read_text(errors="replace") for pattern in ("csrc/**/*", "setup.py", "CMakeLists.txt")
                        for p in ROOT.glob(pattern) if p.is_file())
#: the scripts around orsd: benchmarks, install, tests
SCRIPT_TEXT = "\n".join(p.read_text(errors="replace") for pattern in ("scripts/*", "benchmarks/*.py", "benchmarks/*.sh",
                                                                     "tests/**/*.py", ".ci/*")
                        for p in ROOT.glob(pattern) if p.is_file() and p != Path(__file__).resolve())
#: where environment variables are read or set
BUILD_TEXT = LITERALS + NATIVE_TEXT + SCRIPT_TEXT
#: environment variables of the libraries orsd runs on, found in their own sources (not imported)
LIBRARY_ENV = {"VLLM_": "vllm/envs.py", "TORCHINDUCTOR_": "torch/_inductor/config.py", "CUDA_": "torch/cuda/__init__.py"}
MARKERS = set(re.findall(r'^\s*"(\w+):', (ROOT / "pyproject.toml").read_text(), flags=re.M))
def fields(obj, prefix: str = "") -> set[str]:
    """A config section's keys, nested sections as `lora.rank`."""
    keys = set()
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        keys |= fields(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name}
    return keys


SECTIONS = {s.name: fields(getattr(Config(), s.name)) for s in dataclasses.fields(Config)}
SCRIPTS = console_scripts()


def library_env(name: str) -> bool:
    for prefix, source in LIBRARY_ENV.items():
        if name.startswith(prefix):
            spec = importlib.util.find_spec(source.split("/")[0])
            path = Path(spec.origin).parent.parent / source if spec and spec.origin else None
            return bool(path and path.exists() and name in path.read_text())
    return False


def is_path(token: str) -> bool:
    token = token.rstrip("/")
    return any((base / token).exists() for base in BASES) or any(
        p.as_posix().endswith("/" + token) for p in ROOT.glob("**/" + Path(token).name) if ".venv" not in p.parts)


def is_external(dotted: str) -> bool:
    """A name outside orsd: import its longest importable prefix and look the rest up."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True
    return False


def is_python_name(dotted: str) -> bool:
    if dotted.startswith("orsd._C"):  # the native extension: look it up in the built module
        return is_external(dotted)
    parts = dotted.removeprefix("orsd.").split(".")
    head = parts[0]
    if head in EXTERNAL:
        return is_external(dotted)
    if head in HEAVY:
        return all(part in USED for part in parts[1:])
    if len(parts) == 1:  # defined in orsd, a name its code uses (a library's, a parameter), a builtin
        return head in EVERYTHING or head in USED or hasattr(builtins, head)
    if all(part in MEMBERS.get(owner, set()) for owner, part in zip(parts, parts[1:])):
        return True
    if head not in MEMBERS and head not in EVERYTHING:  # a library's name orsd's code uses (LLM.collective_rpc)
        return all(part in USED for part in parts)
    if head[0].isupper() or len(parts) > 2:
        return False  # a class of orsd, or a module path: resolved member by member only
    # an instance named after its class: env.fork is a method of an *Env class
    return any(parts[1] in members for name, members in CLASSES.items() if head.lower() in name.lower())


def globbed(pattern: str) -> bool:
    try:
        return any(ROOT.glob(pattern))
    except ValueError:  # not a pattern pathlib takes
        return False


def is_key(token: str) -> bool:
    section, _, key = token.partition(".")
    return section in SECTIONS and key in SECTIONS[section]


def is_value(token: str) -> bool:
    if NUMBER.fullmatch(token) or re.fullmatch(r"(['\"]).*\1", token) or token in JSON_WORDS or token in MARKERS:
        return True
    if re.fullmatch(r"(search|click)\[[^\]]*\]", token):  # a command of the shop's grammar (envs/webshop/commands.py)
        return True
    try:
        json.loads("{" + token + "}")  # a JSON member: "solvable": true
        return True
    except ValueError:
        pass
    try:
        return isinstance(ast.literal_eval(token), (list, dict, tuple, set)) or token in ("None", "True", "False")
    except (ValueError, SyntaxError):
        return False


def command_problem(token: str) -> str | None:
    """What a command span names that does not exist: config keys of its overrides, its paths, the
    files it shows from a commit."""
    for word in token.split():
        word = word.strip("\"'")
        override = re.fullmatch(r"([a-z_]+\.[a-z_.]+)=.*", word)
        if override and override.group(1) != "section.key" and not is_key(override.group(1)):
            return f"no config key {override.group(1)}"
        shown = re.fullmatch(r"([0-9a-f]{7,40}):([\w./-]+)", word)
        if shown and subprocess.run(["git", "cat-file", "-e", word], cwd=ROOT, capture_output=True).returncode:
            return f"git has no {word}"
        if not shown and "/" in word and PATH.match(word) and re.search(r"[a-z]", word) \
                and not re.search(r"[<>$*{}]|^/|^runs/|^~|^[A-Z]+/", word) and not is_path(word):
            return f"no such path {word}"
    return None


def problem(token: str, page: str = "") -> str | None:
    """Why `token` (cited on a page whose text is `page`) names nothing, or None."""
    token = token.strip()
    if token.startswith("~/") or PATH.match(token) and (is_path(token) or re.match(r"(runs|build)/|/tmp/", token)):
        return None  # in the repository, or where runs, builds and libraries write
    if any(token in block for block in FENCED.findall(page)):
        return None  # defined by the page's own commands: an arm's label, a run directory
    written = Path(token.rstrip("/")).name
    if (RUN_FILE.match(token) or PATH.match(token)) and any(f'"{written}"' in text or f"'{written}'" in text
                                                           for text in (RUN_STRINGS, SCRIPT_TEXT)):
        return None  # a file or folder orsd writes
    if RUN_FILE.match(token):
        return "written nowhere in orsd/"
    if PATH.match(token) and len(PLACEHOLDER.split(token)) == 1:
        return "no such path"
    if token in SCRIPTS or is_value(token):
        return None
    entry = re.fullmatch(r"([\w.]+):(\w+)", token)  # an entry point: orsd.report.cli:main
    if entry:
        return None if is_python_name(f"{entry.group(1)}.{entry.group(2)}") else f"undefined: {token}"
    if is_key(token):
        return None
    setting = re.fullmatch(r"([a-z_]+\.[a-z_.]+)(=|: ).*", token)
    if setting:
        return None if is_key(setting.group(1)) else f"no config key {setting.group(1)}"
    field = re.fullmatch(r"([a-z_]+): .+", token)  # a key with its value: a config field, a record's key
    if field:
        name = field.group(1)
        known = (any(name in keys for keys in SECTIONS.values()) or name in EVERYTHING or name in USED
                 or re.search(rf"[\"']{re.escape(name)}\b", LITERALS))
        return None if known else f"undefined: {name}"
    if "→" in token and re.fullmatch(r"[\w, →]+", token):  # a dependency direction: packages of orsd
        packages = [name.strip() for part in token.split("→") for name in part.split(",")]
        missing = [name for name in packages if not any((SOURCE / name).glob("*.py"))]
        return f"not packages of orsd: {missing}" if missing else None
    first = token.split()[0]
    if first in SCRIPTS or first in PROGRAMS or first.startswith("-") or re.fullmatch(r"[A-Z_]+=\S*", first) and " " in token:
        return command_problem(token)
    env = re.fullmatch(r"\$?\{?([A-Z][A-Z0-9_]+)\}?(=.*|/.*)?", token)
    if env:
        known = env.group(1) in BUILD_TEXT or library_env(env.group(1))
        return None if known else f"environment variable {env.group(1)} read nowhere"
    called = CALLED.findall(token)
    if FORMULA.search(token):  # math: only a call through an orsd module must resolve
        missing = [name for name in called if "." in name and name.split(".")[0] in MEMBERS
                   and not is_python_name(name)]
        return f"undefined: {missing}" if missing else None
    if called:
        missing = [name for name in called if not (is_python_name(name) or name in USED or name in NATIVE_TEXT)]
        return f"undefined: {missing}" if missing else None
    pattern = PLACEHOLDER.split(token)
    if len(pattern) > 1:  # a pattern: `csrc/cpu/<op>.cpp`, `eval/<split>/success_rate`
        if "/" in token and not token.startswith("/") and globbed(re.sub(r"\*+", "*", PLACEHOLDER.sub("*", token))):
            return None
        missing = [word for word in re.findall(r"[A-Za-z_]\w{2,}", " ".join(pattern)) if word not in LITERALS]
        return f"not in orsd's code: {missing}" if missing else None
    argument = re.fullmatch(r"([a-z_]\w*)=\S*", token)
    if argument:  # a keyword argument: source="generated"
        return None if argument.group(1) in USED else f"undefined: {argument.group(1)}"
    if NAME.fullmatch(token):
        if is_python_name(token):
            return None
        if any(f'"{token}"' in text or f"'{token}'" in text for text in (LITERALS, NATIVE_TEXT)):
            return None  # a value orsd's code holds as a string
        if re.search(rf"\b{re.escape(token)}\b", NATIVE_TEXT):
            return None  # a name of the native code or its build (`cudaGetDeviceCount`)
        return f"undefined: {token}"
    if token in LITERALS or token in NATIVE_TEXT:
        return None  # a literal the code holds: a tag, a placeholder, a message
    return "not a code name (write it without backticks)"


TOKENS = [(page.name, token) for page in DOCS for token in sorted(set(backticked(page.read_text())))]
TEXT = {page.name: page.read_text() for page in DOCS}


def test_the_docs_cite_names():
    assert len(backticked((ROOT / "docs" / "architecture.md").read_text())) > 80
    assert {page for page, _ in TOKENS} == {page.name for page in DOCS if backticked(page.read_text())}


@pytest.mark.parametrize("page, token", TOKENS, ids=[f"{page}:{token}" for page, token in TOKENS])
def test_every_name_a_page_cites_exists(page, token):
    why = problem(token, TEXT[page])
    assert why is None, f"docs/{page} cites `{token}`: {why}"


@pytest.mark.parametrize("token, why", [
    ("Trainer.rollout_everything", "undefined"), ("orsd/train/nowhere.py", "no such path"),
    ("nothing.jsonl", "written nowhere"), ("torch.no_such_thing", "undefined"),
    ("rollout everything at once", "not a code name"), ("no_such_value", "undefined"),
    ("rubric.alphabet=0.1", "no config key"), ("orsd-train rubric.alphabet=0.1", "no config key"),
    ("python benchmarks/nowhere.py", "no such path"), ("ORSD_NO_SUCH_SWITCH=1", "read nowhere"),
    ("git show 9911ba9:benchmarks/nowhere.py", "git has no"), ("vllm.LLM.no_such_method", "undefined"),
])
def test_a_name_that_does_not_exist_is_caught(token, why):
    assert why in (problem(token) or "")


@pytest.mark.parametrize("token", [
    "0.05", "1e-6", "'orsd'", "[]", "bfloat16", "content_free", "rubric.alpha=0.05", "model.autocast: auto",
    "orsd-train rubric.alpha=0.05", "--resume", "pg = max(−A·r, −A·clip(r, 1−ε, 1+ε))", "<think>", "{task}",
    "ONEDNN_MAX_CPU_ISA", "OMP_WAIT_POLICY=PASSIVE", "LLM.collective_rpc",
])
def test_values_commands_formulas_and_literals_are_not_names(token):
    assert problem(token) is None
