"""docs/architecture.md names only what exists: every span in backticks is a path in the repository,
a file a run writes, a config key, or a Python name defined in orsd/ (a module, class, function,
method, attribute or field), dotted names resolved member by member; names outside orsd are
imported and looked up. Issue 58 found seven claims of that file the code contradicted."""

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from orsd.train.config import Config

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "architecture.md"
SOURCE = ROOT / "orsd"
#: where a relative path in the doc may start
BASES = [ROOT, SOURCE, SOURCE / "train", SOURCE / "engines", SOURCE / "envs", ROOT / "csrc", ROOT / "docs"]
#: files a run writes (checked to appear as a string in orsd/, where they are written)
RUN_FILE = re.compile(r"^[\w.-]+\.(jsonl|json|yaml|png|html)$")
PATH = re.compile(r"^[\w./-]*(/[\w.-]*|\.(py|h|cpp|cu|md|txt))$")
CALLED = re.compile(r"([A-Za-z_][\w.]*)\(")


def console_scripts() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, flags=re.M))


def backticked(text: str) -> list[str]:
    """Single-backtick spans outside fenced blocks."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def definitions() -> tuple[dict[str, set[str]], set[str]]:
    """members[owner]: names defined in module or class `owner` (by its last name; a package also
    holds what its __init__ imports), and every name defined anywhere in orsd/."""
    members: dict[str, set[str]] = {}
    everything: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        module = path.parent.name if path.name == "__init__.py" else path.stem
        tree = ast.parse(path.read_text())
        names = members.setdefault(module, set())
        everything.add(module)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                everything.add(node.name)
            if isinstance(node, ast.ClassDef):
                owned = members.setdefault(node.name, set())
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
        names.update(p.stem for p in path.parent.glob("*.py") if path.name == "__init__.py")  # submodules
        everything.update(names)
    return members, everything


MEMBERS, EVERYTHING = definitions()
RUN_STRINGS = "\n".join(p.read_text() for p in SOURCE.rglob("*.py"))
SECTIONS = {s.name: {f.name for f in dataclasses.fields(getattr(Config(), s.name))} for s in dataclasses.fields(Config)}


def is_path(token: str) -> bool:
    token = token.rstrip("/") if token.endswith("/") else token
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
    parts = dotted.removeprefix("orsd.").split(".")
    if parts[0] in ("torch", "dataclasses"):
        return is_external(dotted)
    if len(parts) == 1:
        return parts[0] in EVERYTHING
    return all(part in MEMBERS.get(owner, set()) for owner, part in zip(parts, parts[1:]))


def problem(token: str) -> str | None:
    """Why `token` names nothing, or None."""
    if PATH.match(token):
        return None if is_path(token) else "no such path"
    if RUN_FILE.match(token):
        return None if f'"{token}"' in RUN_STRINGS or f"'{token}'" in RUN_STRINGS else "written nowhere in orsd/"
    if token in console_scripts():
        return None
    if "→" in token:  # a dependency direction: packages of orsd
        packages = [name.strip() for part in token.split("→") for name in part.split(",")]
        missing = [name for name in packages if not any((SOURCE / name).glob("*.py"))]
        return f"not packages of orsd: {missing}" if missing else None
    section, _, key = token.partition(".")
    if section in SECTIONS and key in SECTIONS[section]:
        return None  # a config key
    called = CALLED.findall(token)
    names = called or ([token] if re.fullmatch(r"[A-Za-z_][\w.]*", token) else [])
    if not names:
        return "not a code name (write it without backticks)"
    missing = [name for name in names if not is_python_name(name)]
    return f"undefined: {missing}" if missing else None


def test_the_doc_cites_names():
    assert len(backticked(DOC.read_text())) > 80


@pytest.mark.parametrize("token", sorted(set(backticked(DOC.read_text()))))
def test_every_name_the_architecture_doc_cites_exists(token):
    assert problem(token) is None, f"docs/architecture.md cites `{token}`: {problem(token)}"


@pytest.mark.parametrize("token, why", [
    ("Trainer.rollout_everything", "undefined"), ("orsd/train/nowhere.py", "no such path"),
    ("nothing.jsonl", "written nowhere"), ("torch.no_such_thing", "undefined"), ("A + α·Δ", "not a code name"),
])
def test_a_name_that_does_not_exist_is_caught(token, why):
    assert why in (problem(token) or "")
