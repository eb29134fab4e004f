"""The probe's statistics on fixed inputs: closed-form AUCs, scipy's bootstrap pinned against
normal theory, and the token classes of the answer format."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from orsd.envs.prompts import demonstration_answer
from orsd.probe.stats import auc, correlation, interval, mean_with_interval, paired, token_classes, unpaired
from orsd.train.warmstart import answer_ids


def test_auc_closed_forms():
    assert auc([2.0], [0.0, 1.0, -5.0]) == 1.0  # the expert above every wrong reply
    assert auc([0.0], [1.0, 2.0]) == 0.0
    assert auc([1.0], [1.0, 1.0]) == 0.5  # ties count half
    assert auc([1.0], [0.0, 1.0, 2.0]) == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3
    assert auc([1.0, 3.0], [2.0]) == 0.5
    assert math.isnan(auc([1.0], []))


def test_auc_is_mann_whitney_u_over_the_pairs():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 5, 40).astype(float), rng.integers(0, 5, 30).astype(float)  # many ties
    assert auc(x, y) == pytest.approx(scipy_stats.mannwhitneyu(x, y).statistic / (40 * 30))


def test_paired_auc_is_the_mean_over_states():
    expert = [2.0, 0.0, 1.0, 5.0]
    wrong = [[1.0, 0.0], [1.0, 2.0], [1.0, math.nan], [math.nan]]  # the last state has no finite wrong reply
    result = paired(expert, wrong, seed=0)
    assert result["auc"]["value"] == pytest.approx((1.0 + 0.0 + 0.5) / 3) and result["auc"]["n"] == 3
    assert result["expert_mean"]["value"] == pytest.approx(1.0)
    assert result["wrong_mean"]["value"] == pytest.approx((0.5 + 1.5 + 1.0) / 3)
    assert result["difference_mean"]["value"] == pytest.approx((1.5 - 1.5 + 0.0) / 3)
    low, high = result["auc"]["ci"]
    assert 0.0 <= low <= result["auc"]["value"] <= high <= 1.0


def test_every_expert_above_gives_one_with_a_degenerate_interval():
    result = paired([1.0] * 5, [[0.0, -1.0]] * 5, seed=0)["auc"]
    assert result == {"value": 1.0, "ci": [1.0, 1.0], "n": 5}
    assert paired([1.0] * 5, [[1.0]] * 5, seed=0)["auc"]["value"] == 0.5


def test_bootstrap_interval_of_a_mean_matches_normal_theory():
    """Half zeros, half ones, n = 400: the mean's standard error is 0.025, so the 95 % interval is
    0.5 ± 1.96 · 0.025 = [0.451, 0.549] up to resampling noise; fixed seed, fixed interval."""
    values = np.array([0.0, 1.0] * 200)
    low, high = mean_with_interval(values, seed=0)["ci"]
    assert low == pytest.approx(0.451, abs=0.01) and high == pytest.approx(0.549, abs=0.01)
    assert mean_with_interval(values, seed=0)["ci"] == [low, high]  # reproducible
    assert interval((values[:1],), np.mean, 0) is None  # one value: no interval


def test_unpaired_auc_interval_resamples_both_samples():
    result = unpaired([1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 2.5], seed=0)
    assert result["value"] == pytest.approx((2 + 2 + 3 + 3) / 12)  # 1 and 2 beat two, 3 and 4 all three
    assert result["n_positive"] == 4 and result["n_negative"] == 3
    assert 0.0 <= result["ci"][0] <= result["value"] <= result["ci"][1] <= 1.0
    assert unpaired([1.0], [], seed=0) == {"value": None, "ci": None, "n_positive": 1, "n_negative": 0}


def test_correlation_is_pearson_with_an_interval_over_units():
    rng = np.random.default_rng(0)
    plain = rng.normal(size=60)
    score = -plain + 0.3 * rng.normal(size=60)
    units = np.repeat(np.arange(15), 4)
    result = correlation(score, plain, units, seed=0)
    assert result["value"] == pytest.approx(scipy_stats.pearsonr(score, plain).statistic)
    assert result["value"] < -0.9 and result["units"] == 15
    assert -1.0 <= result["ci"][0] <= result["value"] <= result["ci"][1] < 0
    exact = correlation(2 * plain + 1, plain, units, seed=0)  # every resample's weighted r is 1 too
    assert exact["value"] == pytest.approx(1.0) and exact["ci"] == pytest.approx([1.0, 1.0])


def test_token_classes_find_the_answer_format(smol_tokenizer):
    ids = answer_ids(smol_tokenizer, demonstration_answer("webshop", "click[Buy Now]"))
    classes = token_classes(smol_tokenizer, ids)
    text = {c: "".join(smol_tokenizer.decode([i]) for i, k in zip(ids, classes) if k == c) for c in set(classes)}
    assert classes[-1] == "eos" and classes.count("eos") == 1
    assert text["content"] == "click[Buy Now]"
    assert text["scaffold"] == "<think></think><action></action>"
