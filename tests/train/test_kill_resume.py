"""A run SIGKILLed at any stage and resumed with --resume gives the same steps.jsonl metrics, groups
and weights as an unbroken run; a torn checkpoint is never picked up; the JSONL records and the
verifier cache never hold a half-written line or entry.

Each run is a subprocess of orsd-train's own main (kill_worker.py: the CLI with the scripted test
engine, so rewards differ, bundles parse and the update moves the weights) on a tiny model: 3 steps,
a checkpoint after every step, and an OpenAI-compatible fake verifier on loopback with an on-disk
cache. One broken run is killed again and again and resumed each time. The kills come from the
test hook ORSD_TEST_KILL_AT=<stage>:<step> (orsd.train.checkpoint.kill_point), except the verifier
kill: the fake server SIGKILLs the run when a request of step 2 arrives, while the others are in
flight and their answers are being cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.fake_server import FakeChatServer, Reply, num_criteria_asked, scores_answer
from orsd.report.run_dir import RunDir
from orsd.train import checkpoint

WORKER = Path(__file__).with_name("kill_worker.py")
STEPS = 3

#: how the broken run dies, in the order it meets them: (ORSD_TEST_KILL_AT, or the verifier request
#: whose arrival kills it), and the checkpoint it must resume from next time
KILLS = [
    ("rollout:2", None, 1),
    (None, 4, 1),  # the 4th verifier request of step 2: some answers cached, some in flight
    ("replay:2", None, 1),
    ("update:2", None, 1),
    ("checkpoint:2", None, 1),  # step_2.tmp holds the weights, not the trainer state: never resumed from
    ("checkpoint:3", None, 2),  # the final checkpoint: all 3 steps recorded, the run is not complete
]


def overrides(model_dir: Path, url: str, cache: Path) -> list[str]:
    return [f"model.path={model_dir}", f"train.steps={STEPS}", "train.save_every=1", "train.keep_checkpoints=2",
            "train.progress=false", "train.report=false", "train.tensorboard=false", "warm_start.enabled=false",
            "model.device=cpu", "model.autocast=", "rollout.tasks_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=8", "rollout.max_context_tokens=4096", "env.max_actions=2",
            "rubric.max_new_tokens=8", "rubric.num_bundles=2", "rubric.no_repeat_ngram_size=0", "optim.lr=1e-3",
            "verifier.kind=openai", f"verifier.base_url={url}", "verifier.model=judge", "verifier.scoring=json",
            f"verifier.cache_dir={cache}"]


class Verifier:
    """The fake endpoint: scores that depend only on the prompt (so every run is answered alike),
    and, when armed, a SIGKILL of the run at the arrival of its n-th request."""

    def __init__(self):
        self.url = ""  # set once the server is up
        self.lock = threading.Lock()
        self.victim: int | None = None
        self.countdown = 0
        self.killed = False

    def arm(self, pid: int, nth_request: int) -> None:
        with self.lock:
            self.victim, self.countdown, self.killed = pid, nth_request, False

    def __call__(self, request):
        with self.lock:
            if self.victim is not None:
                self.countdown -= 1
                if self.countdown == 0:
                    os.kill(self.victim, signal.SIGKILL)
                    self.victim, self.killed = None, True
        digest = hashlib.sha256(request.prompt.encode()).digest()
        return Reply.ok(scores_answer([digest[i] % 5 / 4 for i in range(num_criteria_asked(request))]))


@pytest.fixture(scope="module")
def verifier():
    answers = Verifier()
    with FakeChatServer(answers) as server:
        answers.url = server.url
        yield answers


def launch(run_dir: Path, args: list[str], resume: bool, kill_at: str | None = None,
           verifier: Verifier | None = None, nth_request: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != checkpoint.KILL_AT}
    if kill_at:
        env[checkpoint.KILL_AT] = kill_at
    command = [sys.executable, str(WORKER), "--run-dir", str(run_dir), *(["--resume"] if resume else []), *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if nth_request is not None:
        verifier.arm(process.pid, nth_request)
    out, err = process.communicate(timeout=600)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


@pytest.fixture(scope="module")
def unbroken(tiny_smol_dir, tmp_path_factory, verifier):
    run_dir = tmp_path_factory.mktemp("unbroken") / "run"
    done = launch(run_dir, overrides(tiny_smol_dir, verifier.url, run_dir.parent / "cache"), resume=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def assert_whole_lines(run_dir: Path) -> None:
    """Every JSONL file ends with a newline and every line is one JSON record."""
    for name in ("steps.jsonl", "groups.jsonl"):
        raw = (run_dir / name).read_bytes()
        assert raw.endswith(b"\n"), f"{name} ends in a half-written line"
        for line in raw.decode().split("\n")[:-1]:
            json.loads(line)


def assert_whole_cache_entries(cache: Path) -> int:
    """Every cache entry (named by its key; temporaries start with '.tmp-') is a complete JSON object."""
    entries = [p for p in cache.glob("*/*.json") if not p.name.startswith(".tmp-")]
    for entry in entries:
        assert isinstance(json.loads(entry.read_text()), dict), entry
    return len(entries)


def records(run_dir: Path):
    """steps.jsonl without timings and verifier accounting (cache hits differ after a resume, by
    design), groups.jsonl without the verifier's per-call events, and the final weights."""
    out = RunDir(run_dir, writer=False)
    steps = [{k: v for k, v in s.items() if k not in ("seconds", "verifier")} for s in out.read("steps.jsonl")]
    groups = [{k: v for k, v in g.items() if k != "verifier_events"} for g in out.read("groups.jsonl")]
    final = checkpoint.latest(run_dir)
    return steps, groups, final, load_file(next(final.glob("*.safetensors")))


@pytest.mark.slow
def test_killed_at_every_stage_then_resumed_equals_unbroken(tiny_smol_dir, tmp_path, verifier, unbroken):
    broken, cache = tmp_path / "run", tmp_path / "cache"
    args = overrides(tiny_smol_dir, verifier.url, cache)
    for number, (kill_at, nth_request, resumes_from) in enumerate(KILLS):
        died = launch(broken, args, resume=number > 0, kill_at=kill_at, verifier=verifier, nth_request=nth_request)
        where = kill_at or f"verifier request {nth_request}"
        assert died.returncode == -signal.SIGKILL, f"{where}: rc {died.returncode}\n{died.stderr[-3000:]}"
        assert nth_request is None or verifier.killed
        last = checkpoint.latest(broken)
        assert last is not None and checkpoint.step_of(last) == resumes_from, (where, last)
        assert (last / "trainer_state.pt").exists() and list(last.glob("*.safetensors"))
        if kill_at and kill_at.startswith("checkpoint:"):
            step = int(kill_at.split(":")[1])
            torn = broken / "checkpoints" / f"step_{step}.tmp"
            assert torn.is_dir() and not (torn / "trainer_state.pt").exists()  # the torn write is there ...
            assert checkpoint.step_of(last) < step  # ... and not what --resume would pick
        assert_whole_lines(broken)
        assert_whole_cache_entries(cache)

    finished = launch(broken, args, resume=True)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"resumed from {broken / 'checkpoints' / 'step_2'} at step 2" in finished.stdout
    assert_whole_lines(broken)
    assert assert_whole_cache_entries(cache) > 0
    assert not list((broken / "checkpoints").glob("*.tmp"))  # the next save of that step replaced it

    steps_a, groups_a, final_a, weights_a = records(unbroken)
    steps_b, groups_b, final_b, weights_b = records(broken)
    assert [s["step"] for s in steps_b] == list(range(1, STEPS + 1))
    assert steps_a == steps_b
    assert groups_a == groups_b
    assert final_a.name == final_b.name == f"step_{STEPS}"
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name
    initial = load_file(next(Path(tiny_smol_dir).glob("*.safetensors")))
    assert any(not torch.equal(initial[name], weights_a[name]) for name in initial if name in weights_a), \
        "the update never moved the weights: the comparison above would prove nothing"


def test_a_torn_last_line_is_dropped_on_resume(tmp_path):
    """A write cut short by a kill (a large line, a full disk) leaves a last line without its
    newline, possibly in the middle of a UTF-8 character: readers skip it, resume removes it."""
    out = RunDir(tmp_path)
    for step in (1, 2, 3):
        out.append("groups.jsonl", {"step": step, "text": "é" * 3})
    whole = (tmp_path / "groups.jsonl").read_bytes()
    (tmp_path / "groups.jsonl").write_bytes(whole + '{"step": 4, "text": "é'.encode()[:-1])
    assert [r["step"] for r in out.read("groups.jsonl")] == [1, 2, 3]
    out.truncate_after(3)  # no whole record is dropped, the torn one is
    assert (tmp_path / "groups.jsonl").read_bytes() == whole
    out.append("groups.jsonl", {"step": 4})
    assert [r["step"] for r in out.read("groups.jsonl")] == [1, 2, 3, 4]
