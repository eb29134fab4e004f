"""rubric.min_rho (issue 67): a B* whose Spearman ρ with the rewards is ≤ min_rho shapes nothing for
its group (Δ masked, e = 0); off (-1, the default) B* shapes whatever its ρ, as in the paper. The
step counts groups whose B* has ρ ≤ 0 (rho_selected_nonpositive) and those set aside
(groups_below_min_rho) either way."""

import math

import numpy as np
import pytest

from orsd.rubric import VerifierResult
from orsd.rubric.align import align, apply_min_rho, select
from scripted import small_config
from test_step import make_trainer


class AntiAlignedVerifier:
    """Test fake verifier: every bundle is scored high exactly on the trajectories that did not act
    validly (whose rewards are the lower ones), so every bundle's ρ, and B*'s, is negative."""

    async def ascore_many_with_events(self, task, transcripts, bundles):
        acted = np.array([1.0 if "search[shirt]" in t else 0.0 for t in transcripts])
        return [VerifierResult(np.repeat((1.0 - acted)[:, None], len(b.criteria), axis=1)) for b in bundles]


def step_with(tiny_model, tiny_tokenizer, *overrides):
    config = small_config("method.name=orsd", "rubric.alpha=0.5", *overrides)
    trainer = make_trainer(config, tiny_model, tiny_tokenizer, AntiAlignedVerifier())
    return trainer.step()


@pytest.mark.parametrize("min_rho", [None, "-1", "0"])
def test_a_negative_rho_bundle_shapes_only_without_a_threshold_below_it(min_rho, tiny_model, tiny_tokenizer):
    result = step_with(tiny_model, tiny_tokenizer, *([f"rubric.min_rho={min_rho}"] if min_rho else []))
    out, m, replay = result.outputs, result.metrics, result.outputs.replay
    assert all(s.best == 0 and s.rho[0] < 0 for s in out.selection)  # B*: the first of equal bundles
    masked = min_rho == "0"  # -1 is off, as unset
    assert m["rho_selected_nonpositive"] == 2 and m["rho_selected_mean"] == pytest.approx(
        np.mean([s.rho[0] for s in out.selection]))
    if masked:  # no rubric pass, e = 0 everywhere
        assert [s.index for s in out.selection] == [None, None] and [s.set_aside for s in out.selection] == [0, 0]
        assert m["groups_below_min_rho"] == 2 and m["groups_with_bundle"] == 0
        assert not replay.valid.any() and m["delta_abs_mean"] == 0
        assert all(r["selected"] is None and r["reason"].startswith("min_rho") for r in result.records)
    else:  # the paper's rule: the anti-aligned B* still shapes the advantage
        assert [s.index for s in out.selection] == [0, 0] and m["groups_below_min_rho"] == 0
        assert replay.valid.any() and m["delta_abs_mean"] > 0


def test_apply_min_rho_sets_aside_a_spearman_choice_at_or_below_the_threshold():
    scores = [np.array([[0.1], [0.5], [0.9]]), np.array([[0.9], [0.5], [0.1]])]
    rewards = np.array([0.0, 1.0, 0.5])
    chosen = align(scores, rewards)
    rho = chosen.rho[chosen.index]
    assert apply_min_rho(chosen, None) is chosen
    assert apply_min_rho(chosen, rho - 1e-9).index == chosen.index  # above the threshold: kept
    kept_out = apply_min_rho(chosen, rho)  # equal counts as at or below
    assert kept_out.index is None and kept_out.set_aside == chosen.index and kept_out.best == chosen.index
    assert kept_out.rho == chosen.rho and "min_rho" in kept_out.reason
    assert kept_out.to_dict()["set_aside"] == chosen.index
    random_choice = select("random", scores, rewards, rng=0, num_bundles=2)
    assert apply_min_rho(random_choice, 1.0) is random_choice  # the ablations choose without ρ
    none = align([np.full((3, 1), 0.5)], rewards)
    assert none.index is None and math.isnan(none.rho[0]) and apply_min_rho(none, 0.0) is none


def test_min_rho_is_refused_outside_its_range():
    from orsd.train.config import ConfigError, load_config

    assert load_config(None, []).rubric.min_rho == -1
    with pytest.raises(ConfigError, match="rubric.min_rho"):
        load_config(None, ["rubric.min_rho=1.5"])
