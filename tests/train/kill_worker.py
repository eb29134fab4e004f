"""`orsd-train` (orsd.train.cli.main, unchanged) with the rollout engine swapped for the scripted test
engine, for tests/train/test_kill_resume.py.

A tiny random model never writes a valid action or a parsable bundle, so every reward would be
equal, every advantage 0 and the update a no-op: a kill-and-resume test on it would compare weights
that never move. The scripted engine (tests/train/scripted.py) teacher-forces valid actions for
even samples and a parsable bundle for rubric prompts, so rewards differ, the verifier is asked and
the update changes the weights. Run as `python kill_worker.py <orsd-train arguments>`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

from orsd.train import build, cli  # noqa: E402
from scripted import ScriptedEngine  # noqa: E402


def scripted_engine(config, policy, tokenizer, run_dir, dist=None):
    return ScriptedEngine(policy, tokenizer, fully_scripted=True)


if __name__ == "__main__":
    build.build_engine = scripted_engine  # build() looks the factory up at call time
    sys.exit(cli.main(sys.argv[1:]))
