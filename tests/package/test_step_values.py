"""No component is handed the Trainer: the rooms the step calls, evaluation and checkpoints take
values, small specs and plain callables, never the object that holds them all. Only the Trainer's
own module, the console program that drives it (train/cli.py) and the factory that constructs it
(train/build.py) name it."""

import ast
from pathlib import Path

import pytest

ORSD = Path(__file__).resolve().parents[2] / "orsd"
#: the modules that may name the Trainer: its own, the program that drives it, the factory that builds it
DRIVERS = {"train/trainer.py", "train/cli.py", "train/build.py"}
ROOMS = sorted(str(p.relative_to(ORSD)) for p in ORSD.rglob("*.py") if str(p.relative_to(ORSD)) not in DRIVERS)


def trainer_handles(source: str) -> list[str]:
    """Where a module takes, reaches into or imports the trainer: parameters named `trainer`,
    attributes of a name `trainer`, imports of orsd.train.trainer or of `Trainer`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg == "trainer":
                    found.append(f"line {node.lineno}: a parameter named trainer")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "trainer"):
            found.append(f"line {node.lineno}: reaches trainer.{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.endswith("trainer") or any(alias.name == "Trainer" for alias in node.names):
                found.append(f"line {node.lineno}: imports {module or '.'}")
    return found


@pytest.mark.parametrize("room", ROOMS)
def test_no_room_is_handed_the_trainer(room):
    assert trainer_handles((ORSD / room).read_text()) == []


def test_the_drivers_exist():
    assert all((ORSD / driver).is_file() for driver in DRIVERS), "a driver moved: update DRIVERS"
    assert len(ROOMS) > 80  # every other module of orsd/


def test_the_check_sees_a_trainer_parameter_and_import():
    source = "from orsd.train.trainer import Trainer\ndef write(trainer, groups):\n    return trainer.policy\n"
    assert trainer_handles(source) == ["line 1: imports orsd.train.trainer", "line 2: a parameter named trainer",
                                       "line 3: reaches trainer.policy"]
