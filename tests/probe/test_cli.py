"""`orsd-probe` end to end on a tiny random model (the CI smoke): the outputs' contents, and the
one-line errors for bad arguments."""

import json

import pytest

from orsd import envs
from orsd.probe import cli
from orsd.probe.kinds import KINDS
from orsd.probe.stats import SCORES
from orsd.engines.base import Generation
from scripted import BUNDLE, ExpertReplayEngine


class PerTaskBundles(ExpertReplayEngine):
    """ExpertReplayEngine whose bundles name their task in a last criterion, so that B* differs
    between tasks (the shuffled control draws only criteria that B* lacks)."""

    def generate(self, prompts, sampling, keys=None):
        out = super().generate(prompts, sampling, keys)
        for i, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            if "process rubric" in text.lower() and "criteria" in text:
                task = next(t for d, t in self.by_description.items() if d in text)
                answer = BUNDLE + f"\n7. The agent buys what task {task.id} asks for."
                ids = self.tokenizer.encode(answer, add_special_tokens=False) + [self.stop]
                out[i] = Generation(ids, [-0.5] * len(ids), True)
        return out


def figures_in_range(result: dict):
    """Every AUC in [0, 1] with its interval around it; every interval ordered."""
    for name, _, _ in SCORES:
        f = result["scores"][name]
        for auc in [f["expert_vs_wrong"]["auc"], f["auc_per_token"], f["policy_auc"], *f["auc_by_page"].values()]:
            if auc["value"] is not None:
                assert 0.0 <= auc["value"] <= 1.0
                if auc["ci"] is not None:
                    assert 0.0 <= auc["ci"][0] <= auc["value"] <= auc["ci"][1] <= 1.0


def check_counts(result: dict, tasks: int, wrong: int, samples: int):
    c = result["counts"]
    assert len(result["tasks"]) == tasks and len({t["id"] for t in result["tasks"]}) == tasks
    assert c["states"] == len(result["states"]) == c["expert_replies"] and c["states"] >= 3 * tasks
    assert c["wrong_replies"] == sum(len(s["replies"]) - 1 for s in result["states"]) <= wrong * c["states"]
    assert c["states_with_wrong_replies"] == c["states"]  # every expert state has a valid wrong command
    assert sorted(c["states_by_page"]) == ["item", "results", "search"]
    roles = [r["role"] for r in result["replies"]]
    assert roles.count("policy") == c["policy_replies"] >= samples * tasks
    assert len({(r["task"], r["trajectory"]) for r in result["replies"] if r["role"] == "policy"}) == samples * tasks
    assert all(set(r["lp"]) == set(KINDS) for r in result["replies"])
    assert set(result["scores"]) == {name for name, _, _ in SCORES}


def test_probe_cli_smoke_with_a_policy_that_plays_the_expert_half_the_time(tiny_smol_dir, tmp_path, monkeypatch,
                                                                          capsys, one_torch_thread):
    """A random model never writes an action or a bundle: its rollouts come from a scripted engine
    (sample 0 plays the expert, sample 1 gives no action; bundle prompts get a fixed bundle), so the
    rewards differ, B* is selected and every kind is scored; the replay is the tiny model's.
    (model.threads=1: the tiny model runs fastest on one thread; `one_torch_thread` restores the count.)"""
    monkeypatch.setattr(cli, "make_engine", lambda policy, tokenizer, config: PerTaskBundles(
        tokenizer, envs.make("webshop", split="test"), lambda task, sample: sample == 0, split="test"))
    out = tmp_path / "probe"
    argv = [str(tiny_smol_dir), "--tasks", "2", "--samples", "2", "--wrong-per-state", "2", "--out", str(out),
            "--heatmap-states", "3", "model.autocast=", "model.threads=1", "env.max_history_turns=0"]
    assert cli.main(argv) == 0
    assert "paired AUC of Δ: oracle" in capsys.readouterr().out
    result = json.loads((out / "probe.json").read_text())
    check_counts(result, tasks=2, wrong=2, samples=2)
    figures_in_range(result)
    for kind in KINDS:  # every kind has a rubric on every task and an AUC
        assert all(t["rubrics"][kind] for t in result["tasks"]), kind
        assert result["scores"][f"Δ {kind}"]["expert_vs_wrong"]["auc"]["value"] is not None, kind
    assert all(t["alignment"]["index"] is not None for t in result["tasks"])
    c = result["counts"]
    assert 0 < c["policy_matching_expert"] < c["policy_replies"]
    assert result["scores"]["Δ oracle"]["policy_auc"]["value"] is not None
    assert result["scores"]["plain"]["policy_auc"]["n_positive"] == c["policy_matching_expert"]
    tokens = result["scores"]["Δ oracle"]["tokens"]["scripted"]
    assert all(tokens[w]["n"] == c["expert_replies"] + c["wrong_replies"] for w in ("first", "scaffold", "eos"))
    assert result["config"]["env"]["max_history_turns"] == 0 and result["checkpoint"] == str(tiny_smol_dir)
    markdown, page = (out / "probe.md").read_text(), (out / "probe.html").read_text()
    assert "| Δ oracle |" in markdown and "| oracle − content_free |" in markdown
    assert page.count('class="group"') == 3 and page.count("<summary>") == 3 * len(KINDS)


def test_probe_applies_rubric_min_rho_as_training_does(tiny_smol_dir, tmp_path, monkeypatch, one_torch_thread):
    """rubric.min_rho=1: every B* has ρ <= 1, so the probe sets each aside as training would (e = 0
    there): no `selected` rubric, and the note says why."""
    monkeypatch.setattr(cli, "make_engine", lambda policy, tokenizer, config: PerTaskBundles(
        tokenizer, envs.make("webshop", split="test"), lambda task, sample: sample == 0, split="test"))
    out = tmp_path / "probe"
    assert cli.main([str(tiny_smol_dir), "--tasks", "2", "--samples", "2", "--wrong-per-state", "1", "--out",
                     str(out), "model.autocast=", "model.threads=1", "env.max_history_turns=0",
                     "rubric.min_rho=1"]) == 0
    result = json.loads((out / "probe.json").read_text())
    for task in result["tasks"]:
        assert task["rubrics"]["selected"] is None and task["alignment"]["set_aside"] is not None
        assert task["notes"]["selected"].startswith("no B*: min_rho: B*")
    assert result["scores"]["Δ selected"]["expert_vs_wrong"]["auc"]["n"] == 0


def test_probe_cli_on_the_random_model_itself(tiny_smol_dir, tmp_path, one_torch_thread):
    """The real engine: the random model writes no valid action, so its rollouts' rewards are equal
    and, as in training, no B* exists: the kinds that need one are absent and say why."""
    out = tmp_path / "probe"
    assert cli.main([str(tiny_smol_dir), "--tasks", "2", "--samples", "2", "--wrong-per-state", "3",
                     "--out", str(out), "model.autocast=", "model.threads=1"]) == 0
    result = json.loads((out / "probe.json").read_text())
    check_counts(result, tasks=2, wrong=3, samples=2)
    figures_in_range(result)
    assert result["counts"]["policy_without_action"] == result["counts"]["policy_replies"]
    for task in result["tasks"]:
        assert task["rubrics"]["selected"] is None and task["rubrics"]["rejected"] is None
        assert task["notes"]["selected"].startswith("no B*: rewards equal")
        assert task["rubrics"]["oracle"] and task["rubrics"]["misleading"] and task["rubrics"]["content_free"]
    assert result["scores"]["Δ selected"]["expert_vs_wrong"]["auc"]["n"] == 0
    assert result["scores"]["Δ oracle"]["expert_vs_wrong"]["auc"]["n"] == result["counts"]["states"]


@pytest.mark.parametrize("argv, names", [
    (["does/not/exist"], "CHECKPOINT=does/not/exist: not found"),
    (["smollm2-135m", "--tasks", "0"], "--tasks=0: expected an integer >= 1"),
    (["smollm2-135m", "--wrong-per-state", "-1"], "--wrong-per-state=-1: expected an integer >= 1"),
    (["smollm2-135m", "--split", "nope"], "--split=nope: expected one of"),
    (["smollm2-135m", "env.name=alfworld"], "env.name='alfworld'"),
    (["smollm2-135m", "rollout.nonsense=1"], "rollout.nonsense"),
])
def test_bad_arguments_are_one_line_errors(argv, names, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("orsd-probe: ") and names in err and err.count("\n") == 1
