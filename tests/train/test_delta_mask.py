"""rubric.delta_mask: format (e = 0 on the answer format's tags, orsd/train/delta.py format_keep) and
the shaping magnitude recorded on every step (delta.shaping_metrics)."""

from types import SimpleNamespace

import pytest
import torch

from orsd.envs.actions import scaffold_spans
from orsd.train.delta import format_keep, shaping_metrics
from orsd.train.records import TurnRecord
from orsd.train.replay import ReplaySpec, paired_replay
from scripted import ScriptedEngine, small_config

REPLY = "<think>find it</think><action>search[red shirt]</action>"


def kept_and_masked(tokenizer, ids):
    keep = format_keep(tokenizer, ids, {})
    pieces = [tokenizer.decode([i]) for i in ids]
    return ("".join(p for p, k in zip(pieces, keep) if k), "".join(p for p, k in zip(pieces, keep) if not k))


def test_the_scaffold_is_the_four_tags_as_parse_action_reads_them():
    text = " <THINK> go </think>\n< action >click[Buy Now]</ Action >\n"
    assert [text[a:b] for a, b in scaffold_spans(text)] == [" <THINK> ", " </think>\n", "< action >", "</ Action >\n"]
    assert scaffold_spans("search[<query>] <actions> <thinking>") == []


def test_format_keep_on_canonical_tokens(smol_tokenizer):
    ids = smol_tokenizer.encode(REPLY, add_special_tokens=False) + [smol_tokenizer.eos_token_id]
    kept, masked = kept_and_masked(smol_tokenizer, ids)
    assert masked == "<think></think><action></action>"
    assert kept == "find itsearch[red shirt]<|im_end|>"  # the thought, the command, the end of the turn
    assert format_keep(smol_tokenizer, ids, {})[0] is False  # the first token, `<`


def test_format_keep_on_a_reply_spelled_one_character_per_token(smol_tokenizer):
    """Ids the tokenizer would never produce (the rollout keeps whatever was sampled): the same
    characters are masked."""
    ids = [smol_tokenizer.convert_tokens_to_ids(smol_tokenizer.tokenize(c)[0]) for c in REPLY]
    assert ids != smol_tokenizer.encode(REPLY, add_special_tokens=False)
    kept, masked = kept_and_masked(smol_tokenizer, ids)
    assert masked == "<think></think><action></action>" and kept == "find itsearch[red shirt]"


@pytest.mark.parametrize("which", ["smol", "tiny"])
def test_tags_in_any_case_and_spacing_and_multibyte_thoughts(tiny_tokenizer, smol_tokenizer, which):
    """Tags as parse_action reads them (any case, spaces inside the brackets) and a newline between
    them are masked; a token holding a character of the thought (" café", SmolLM2's " �" of the
    cup's first byte) keeps its Δ, whatever the tokenizer."""
    tokenizer = smol_tokenizer if which == "smol" else tiny_tokenizer
    ids = tokenizer.encode("<think> café ☕ go</think>\n< Action >click[Buy Now]</ action>", add_special_tokens=False)
    keep = format_keep(tokenizer, ids, {})
    _, masked = kept_and_masked(tokenizer, ids)
    assert masked == "<think></think>\n< Action ></ action>"
    assert tokenizer.decode([i for i, k in zip(ids, keep) if k]) == " café ☕ goclick[Buy Now]"


def test_masked_format_tokens_get_e_zero_and_the_others_keep_delta(tiny_model, tiny_tokenizer):
    response = tiny_tokenizer.encode(REPLY, add_special_tokens=False)
    records = [TurnRecord(0, [5, 6, 7, 8, 9], response, [0.0] * len(response), 3, "", None, "", True, False, False,
                          False) for _ in range(2)]
    keep = format_keep(tiny_tokenizer, response, {})
    assert not all(keep) and any(keep)
    rubric = [11, 12, 13, 14]
    plain = paired_replay(tiny_model, records, [1.0, -1.0], [rubric, rubric], 0.5, ReplaySpec(1.0, 4096))
    masked = paired_replay(tiny_model, records, [1.0, -1.0], [rubric, rubric], 0.5, ReplaySpec(1.0, 4096),
                           record_keep=[keep, None])  # the second record unmasked: as the paper
    first = slice(5, 5 + len(response))
    flags = torch.tensor(keep)
    assert (masked.delta[first][~flags] == 0).all() and not masked.valid[first][~flags].any()
    assert (masked.advantages[first][~flags] == 1.0).all()  # A_GRPO alone there
    assert (masked.delta[first][flags].abs() > 1e-6).all()  # Δ elsewhere, as without the mask
    assert torch.equal(masked.delta[first][flags], plain.delta[first][flags])
    assert (plain.delta[first][~flags].abs() > 1e-6).all()  # what the mask took away
    second = slice(5 + len(response) + 5, None)
    assert torch.equal(masked.delta[second], plain.delta[second]) and masked.valid[second].all()


def fake_replay(delta, valid, grpo, eligible, response, seq_ids, paper=None):
    return SimpleNamespace(delta=torch.tensor(delta), valid=torch.tensor(valid), grpo_advantages=torch.tensor(grpo),
                           eligible=torch.tensor(eligible), delta_paper=paper,
                           packed=SimpleNamespace(response_mask=torch.tensor(response), seq_ids=torch.tensor(seq_ids)))


def test_shaping_ratio_counts_e_one_tokens_with_a_nonzero_grpo_advantage():
    # two records: [ctx, r, r, r] advantage 2 (e = 1 on the last two), [ctx, r, r] advantage 0
    replay = fake_replay(delta=[0.0, 0.0, 4.0, -8.0, 0.0, 3.0, 3.0],
                         valid=[False, False, True, True, False, True, True],
                         grpo=[0.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0], eligible=[True, True],
                         response=[False, True, True, True, False, True, True], seq_ids=[0, 0, 0, 0, 1, 1, 1],
                         paper=torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, -2.0, -2.0]))
    metrics = {k: v for k, (v, _) in shaping_metrics(replay, alpha=0.5).items()}
    # ratios |0.5·4| / 2 = 1 and |0.5·−8| / 2 = 2; the second record's A_GRPO is 0: not counted
    assert metrics["shaping_ratio_mean"] == pytest.approx(1.5)
    assert metrics["shaping_ratio_median"] == pytest.approx(1.0)  # torch's median: the lower middle
    assert metrics["shaping_ratio_p90"] == pytest.approx(1.9)
    assert metrics["delta_first_token_mean"] == pytest.approx((0.0 + 3.0) / 2)  # e·Δ on each first token
    assert metrics["delta_paper_mean"] == pytest.approx(-0.5) and metrics["delta_paper_abs_mean"] == 1.5
    nothing = fake_replay([0.0, 1.0], [False, True], [0.0, 0.0], [True], [False, True], [0, 0])
    metrics = {k: v for k, (v, _) in shaping_metrics(nothing, 0.5).items()}
    assert metrics["shaping_ratio_mean"] is None and metrics["delta_first_token_mean"] == 1.0
    assert "delta_paper_mean" not in metrics


def test_the_format_mask_in_a_step_zeroes_the_first_token(tiny_model, tiny_tokenizer):
    """Every scripted reply starts with `<think>`: with the mask the first token's e·Δ is 0 in every
    turn, without it Δ there is what the rubric does to `<`."""
    from test_step import ScriptedVerifier, make_trainer

    from tiny_model import make_tiny_qwen3

    results = {}
    for mask in ("none", "format"):
        config = small_config("method.name=orsd", f"rubric.delta_mask={mask}")
        model = make_tiny_qwen3(tiny_tokenizer).train()  # the same seeded weights for both runs
        trainer = make_trainer(config, model, tiny_tokenizer, ScriptedVerifier())
        trainer.engine = trainer.writer.engine = ScriptedEngine(model, tiny_tokenizer, fully_scripted=True)
        results[mask] = trainer.step()
    paper, masked = results["none"], results["format"]
    assert abs(paper.metrics["delta_first_token_mean"]) > 1e-4 and masked.metrics["delta_first_token_mean"] == 0
    turns = masked.records[0]["delta_example"]["turns"]
    records = masked.groups[0].trajectories[0].records
    assert len(turns) == len(records) and turns
    for turn, record in zip(turns, records):
        keep = format_keep(tiny_tokenizer, record.response_ids, {})
        assert turn["valid"] == keep and keep[0] is False and any(keep)
        assert all(delta == 0 for delta, k in zip(turn["delta"], keep) if not k)
    assert masked.metrics["shaping_ratio_mean"] is not None
