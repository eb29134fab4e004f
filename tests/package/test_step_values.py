"""Following a step's groups from rollout to update, no component is handed the Trainer: the rooms
the step calls take values (and plain callables), never the object that holds them all."""

import ast
from pathlib import Path

import pytest

ORSD = Path(__file__).resolve().parents[2] / "orsd"
#: every room Trainer.step passes the groups (or what came of them) through, besides trainer.py
STEP_ROOMS = ["train/rollout.py", "train/bundles.py", "train/overlap.py", "train/delta.py", "train/shaping.py",
              "train/packing.py", "train/forward.py", "train/head.py", "train/replay.py", "train/teacher.py",
              "train/loss.py", "train/step_records.py", "train/records.py", "train/metrics.py",
              *sorted(str(p.relative_to(ORSD)) for p in (ORSD / "methods").glob("*.py"))]


def trainer_handles(source: str) -> list[str]:
    """Where a module takes or imports the trainer: parameters named `trainer`, imports of
    orsd.train.trainer or of `Trainer`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if arg.arg == "trainer":
                    found.append(f"line {node.lineno}: a parameter named trainer")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.endswith("trainer") or any(alias.name == "Trainer" for alias in node.names):
                found.append(f"line {node.lineno}: imports {module or '.'}")
    return found


@pytest.mark.parametrize("room", STEP_ROOMS)
def test_no_room_of_the_step_is_handed_the_trainer(room):
    assert (ORSD / room).is_file(), f"{room} is gone: update STEP_ROOMS"
    assert trainer_handles((ORSD / room).read_text()) == []


def test_the_check_sees_a_trainer_parameter_and_import():
    source = "from orsd.train.trainer import Trainer\ndef write(trainer, groups):\n    return trainer\n"
    assert trainer_handles(source) == ["line 1: imports orsd.train.trainer", "line 2: a parameter named trainer"]
