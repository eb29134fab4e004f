"""rubric.delta_baseline (orsd/train/delta.py): the control bundle's message made exactly as long as
B*'s, spliced at the same slot, forwarded with B*'s in one pass; Δ = lp(with B*) − lp(with control)."""

import random
from types import SimpleNamespace

import pytest
import torch

from orsd import envs, rubric
from orsd.methods import Advantages, Candidates
from orsd.rubric import Alignment, RubricBundle
from orsd.rubric.controls import CONTENT_FREE_CRITERIA, content_free_bundle
from orsd.train import delta as deltas
from orsd.train.bundles import rubric_ids
from orsd.train.model import frozen_copy
from orsd.train.records import Group, Trajectory, TurnRecord
from orsd.train.packing import pack, splice_privileged
from orsd.train.replay import ReplaySpec, paired_replay, plain_replay
from orsd.train.rollout import build_context, render
from orsd.train.config import Config
from scripted import small_config

B_STAR = RubricBundle(["The agent searches with the words of the task before it clicks anything.",
                       "The agent opens a product whose title names the requested product type.",
                       "The agent selects every option that the task names before it buys.",
                       "The agent compares the price with the budget stated in the task.",
                       "The agent clicks Buy Now only on the page of a matching product."])
SHORT = RubricBundle(["Search first.", "Then buy it."])
LONG = RubricBundle([c + " It does so at every single turn of the episode, without exception." for c in B_STAR.criteria]
                    + ["The agent never repeats an action that had no visible effect on the page at all."])
REPLY = "<think>find it</think><action>search[red shirt]</action>"


class LengthOnly(torch.nn.Module):
    """Test fake: a causal LM whose next-token distribution depends only on how many tokens
    precede it (a seeded embedding of the position, then a linear head), never on which tokens."""

    def __init__(self, vocab_size: int, hidden: int = 8, positions: int = 4096):
        super().__init__()
        torch.manual_seed(0)
        self.position = torch.nn.Embedding(positions, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab_size, bias=False)
        torch.nn.init.normal_(self.lm_head.weight, std=2.0)
        self.config = SimpleNamespace(vocab_size=vocab_size)
        decoder = self

        class Decoder(torch.nn.Module):
            def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None):
                mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
                return SimpleNamespace(last_hidden_state=decoder.position((mask.cumsum(-1) - 1).clamp(min=0)))

        self.decoder = Decoder()

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.lm_head


def shop_records(tokenizer, count=3):
    """TurnRecords of real shop states in SmolLM2's chat format, each answered by REPLY."""
    env = envs.make("webshop", max_actions=5)
    response = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    records = []
    for seed in range(count):
        task = env.sample_task(random.Random(seed))
        episode = env.fork()
        trajectory = Trajectory(task=task, observations=[episode.reset(task)], actions=[])
        for _ in range(seed % 2 + 1):
            action = episode.expert_action()
            trajectory.observations.append(episode.step(action)[0])
            trajectory.actions.append(action)
        context, slot, _ = build_context(tokenizer, episode, trajectory, 8192)
        records.append(TurnRecord(0, context, list(response), [0.0] * len(response), slot, REPLY, None, "",
                                  True, False, False, False))
    return records, task


def one_group_per_record(records, task):
    groups = [Group(task, [Trajectory(task, [], [], records=[r])]) for r in records]
    advantages = Advantages([[1.0]] * len(groups), [[[1.0]]] * len(groups))
    return groups, advantages


@pytest.mark.parametrize("role", ["system", "user"])
def test_a_control_message_has_b_stars_exact_length_and_the_templates_frame(smol_tokenizer, role):
    target = rubric_ids(smol_tokenizer, rubric.rubric_context(B_STAR), role)
    frame = smol_tokenizer.decode(rubric_ids(smol_tokenizer, "@@", role)).split("@@")
    assert frame[0].endswith(f"{role}\n") and frame[1].startswith("<|im_end|>")
    bodies = {}
    for name, bundle in [("short", SHORT), ("same", B_STAR), ("long", LONG)]:
        control = deltas.control_ids(smol_tokenizer, bundle, len(target), None, role)
        assert len(control) == len(target)
        text = smol_tokenizer.decode(control)
        assert text.startswith(frame[0] + "Process rubric for this task (privileged guidance):\n1. ")
        assert text.endswith(frame[1])
        bodies[name] = text[len(frame[0]):len(text) - len(frame[1])]
    # padded inside the message: the whole rubric, then content-free sentences
    assert bodies["short"].startswith(rubric.rubric_context(SHORT) + " " + CONTENT_FREE_CRITERIA[0])
    assert bodies["same"] == rubric.rubric_context(B_STAR)  # nothing to cut or pad
    # cut inside the message: a prefix of the rendered rubric (its last token may be a word's start)
    long = rubric.rubric_context(LONG)
    assert long.startswith(bodies["long"][:-12]) and len(bodies["long"]) < len(long) - 100


def test_a_control_as_long_as_its_rendering_is_the_chat_templates_message(smol_tokenizer):
    """With nothing to cut or pad, the control's ids are the template's rendering of its message, and
    spliced at a record's slot they equal the conversation rendered with that message inserted
    there (the check B*'s splice passes in tests/train/test_records.py)."""
    records, _ = shop_records(smol_tokenizer, count=1)
    record = records[0]
    control = content_free_bundle(B_STAR)
    own = rubric_ids(smol_tokenizer, rubric.rubric_context(control), "system")
    ids = deltas.control_ids(smol_tokenizer, control, len(own), None, "system")
    assert ids == own
    ours = record.context_ids[:record.rubric_slot] + ids + record.context_ids[record.rubric_slot:]
    prefix = [{"role": "system", "content": "x"}]
    assert render(smol_tokenizer, prefix + [{"role": "system", "content": rubric.rubric_context(control)}],
                  generation_prompt=False)[-len(ids):] == ids
    # the packed splice (ops.splice_rubric) does the same on a batch, and maps the plain positions back
    packed = pack(records)
    spliced = splice_privileged(packed, records, [ids])
    assert spliced.ids.tolist() == ours + record.response_ids
    assert torch.equal(spliced.ids[spliced.pos_map], packed.ids)


def test_control_ids_none_where_the_message_leaves_no_room(smol_tokenizer):
    frame = rubric_ids(smol_tokenizer, "A", "system")
    assert deltas.control_ids(smol_tokenizer, B_STAR, len(frame) - 1, None, "system") is None


def length_only_case(smol_tokenizer, kind="content_free"):
    records, task = shop_records(smol_tokenizer)
    groups, advantages = one_group_per_record(records, task)
    config = small_config(f"rubric.delta_baseline={kind}", "rollout.max_context_tokens=8192")
    bundles = [B_STAR, LONG, SHORT]
    candidates = [Candidates([b, other]) for b, other in zip(bundles, [SHORT, B_STAR, LONG])]
    selection = [Alignment(rho=[0.8, -0.1], index=0, reason="", method="spearman")] * len(groups)
    controls = deltas.control_bundles(kind, candidates, selection, bundles, seed=0, step=0)
    inputs = deltas.replay_inputs(smol_tokenizer, config, groups, advantages, bundles, controls)
    return records, inputs


@pytest.mark.parametrize("kind", ["content_free", "rejected", "shuffled"])
def test_with_a_model_that_reads_only_lengths_the_control_gives_zero_and_the_paper_does_not(smol_tokenizer, kind):
    """The acceptance check of issue 60: a model whose output depends only on the context's length
    sees B* and its control alike, so Δ = 0 on every response token; the paper's Δ (against the plain
    context, B*'s length shorter) is not 0."""
    records, inputs = length_only_case(smol_tokenizer, kind)
    model = LengthOnly(len(smol_tokenizer))
    assert all(c is not None and len(c) == len(r) for c, r in zip(inputs.controls, inputs.rubrics))
    assert all(c != r for c, r in zip(inputs.controls, inputs.rubrics))  # other tokens, same length
    out = paired_replay(model, inputs.records, inputs.advantages, inputs.rubrics, 0.5,
                        ReplaySpec(1.0, 65536, share_prefix=False), record_controls=inputs.controls)
    response = out.packed.response_mask
    assert out.valid[response].all() and out.eligible.all()
    assert torch.equal(out.delta, torch.zeros_like(out.delta))
    assert torch.equal(out.advantages[response], torch.ones(int(response.sum())))
    assert (out.delta_paper[response].abs() > 1e-3).all()
    paper = paired_replay(model, inputs.records, inputs.advantages, inputs.rubrics, 0.5,
                          ReplaySpec(1.0, 65536, share_prefix=False))
    assert torch.equal(paper.delta, out.delta_paper)  # the paper's Δ, recorded beside the control's
    assert paper.delta_paper is None


def test_a_group_without_a_control_gets_e_zero(smol_tokenizer):
    """rejected with B* the only candidate: no control, so no Δ for that group (nor a forward)."""
    records, task = shop_records(smol_tokenizer, count=2)
    groups, advantages = one_group_per_record(records, task)
    config = small_config("rubric.delta_baseline=rejected", "rollout.max_context_tokens=8192")
    candidates = [Candidates([B_STAR, SHORT]), Candidates([B_STAR])]
    selection = [Alignment(rho=[0.8, -0.1], index=0, reason="", method="spearman"),
                 Alignment(rho=[0.8], index=0, reason="", method="spearman")]
    controls = deltas.control_bundles("rejected", candidates, selection, [B_STAR, B_STAR], 0, 0)
    assert controls[0].bundle.criteria == SHORT.criteria and controls[1].bundle is None
    assert controls[1].to_record() == {"kind": "rejected", "criteria": None,
                                       "reason": "no other candidate bundle in the group: e = 0"}
    inputs = deltas.replay_inputs(smol_tokenizer, config, groups, advantages, [B_STAR, B_STAR], controls)
    assert inputs.rubrics[1] is None and inputs.controls[1] is None and inputs.rubrics[0] is not None
    out = paired_replay(LengthOnly(len(smol_tokenizer)), inputs.records, inputs.advantages, inputs.rubrics, 0.5,
                        ReplaySpec(1.0, 65536, share_prefix=False), record_controls=inputs.controls)
    assert out.eligible.tolist() == [True, False]
    second = slice(int(out.packed.cu_seqlens[1]), None)
    assert not out.valid[second].any() and (out.delta[second] == 0).all()


def test_the_control_has_b_stars_fit_to_the_context_budget(smol_tokenizer):
    records, task = shop_records(smol_tokenizer, count=1)
    groups, advantages = one_group_per_record(records, task)
    ids = rubric_ids(smol_tokenizer, rubric.rubric_context(B_STAR), "system")
    budget = records[0].num_tokens + len(ids)
    controls = deltas.control_bundles("content_free", [Candidates([B_STAR])], [None], [B_STAR], 0, 0)
    for limit, fits in [(budget, True), (budget - 1, False)]:
        config = small_config("rubric.delta_baseline=content_free", "rollout.max_new_tokens=1",
                              f"rollout.max_context_tokens={limit}")
        inputs = deltas.replay_inputs(smol_tokenizer, config, groups, advantages, [B_STAR], controls)
        assert (inputs.rubrics[0] is not None) == (inputs.controls[0] is not None) == fits


def hand_lp(model, context, response):
    with torch.no_grad():
        logits = model(torch.tensor([context + response])).logits[0].double()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor((context + response)[1:])[:, None]).squeeze(-1)
    return lp[-len(response):]


@pytest.mark.parametrize("share_prefix, reuse_plain", [(True, True), (True, False), (False, False)])
def test_the_control_pass_equals_whole_forwards_of_both_spliced_contexts(tiny_model, share_prefix, reuse_plain):
    """Δ against hand computations: lp of the response after context[:slot] + B* + context[slot:]
    minus after the same with the control, and the paper's Δ against the plain context; on the
    shared-prefix path continuing from the plain pass's keys/values, without it, and whole forwards."""
    rng = random.Random(1)
    rubrics = [[rng.randrange(3, 90) for _ in range(6)], [rng.randrange(3, 90) for _ in range(4)]]
    controls = [[rng.randrange(3, 90) for _ in range(6)], [rng.randrange(3, 90) for _ in range(4)]]
    shared = [rng.randrange(3, 90) for _ in range(12)]
    records, record_rubrics, record_controls = [], [], []
    for i in range(7):
        context = shared + [rng.randrange(3, 90) for _ in range(rng.randint(1, 9))]
        slot = len(context) - rng.randint(0, 2)
        response = [rng.randrange(3, 90) for _ in range(rng.randint(1, 5))]
        records.append(TurnRecord(0, context, response, [0.0] * len(response), slot, "", None, "", True, False, False,
                                  False))
        record_rubrics.append(None if i == 5 else rubrics[i % 2])
        record_controls.append(None if i == 6 else controls[i % 2])
    advantages = [0.5 * i - 1 for i in range(len(records))]
    tiny_model.eval()
    plain = plain_replay(tiny_model, records, ReplaySpec(1.0, 4096, share_prefix=share_prefix),
                         keep_prefixes=reuse_plain)
    out = paired_replay(tiny_model, records, advantages, record_rubrics, 0.25,
                        ReplaySpec(1.0, 4096, share_prefix=share_prefix, reuse_plain=reuse_plain), plain=plain,
                        record_controls=record_controls)
    def span(s):
        return slice(int(out.packed.cu_seqlens[s]) + len(records[s].context_ids), int(out.packed.cu_seqlens[s + 1]))

    for s in (5, 6):  # no rubric, no control: e = 0, A = A_GRPO
        assert not out.valid[span(s)].any() and (out.advantages[span(s)] == advantages[s]).all()
    for s, record in enumerate(records[:5]):
        def at(privileged):
            return record.context_ids[:record.rubric_slot] + privileged + record.context_ids[record.rubric_slot:]
        with_rubric = hand_lp(tiny_model, at(record_rubrics[s]), record.response_ids)
        with_control = hand_lp(tiny_model, at(record_controls[s]), record.response_ids)
        plain_lp = hand_lp(tiny_model, record.context_ids, record.response_ids)
        assert out.valid[span(s)].all()
        assert out.delta[span(s)].double() == pytest.approx(with_rubric - with_control, abs=4e-5)
        assert out.delta_paper[span(s)].double() == pytest.approx(with_rubric - plain_lp, abs=4e-5)
        assert out.advantages[span(s)].double() == pytest.approx(
            advantages[s] + 0.25 * (with_rubric - with_control), abs=2e-5)
        assert (with_rubric - with_control).abs().max() > 1e-4
    assert out.eligible.tolist() == [True, True, True, True, True, False, False]


def test_one_pass_forwards_b_stars_and_the_controls_rows(tiny_model, monkeypatch):
    """The control pass is the rubric pass's forward, not a second one: one call of replay's log-prob
    pass on the joined packing, its rows continuing from the plain pass's kept keys/values."""
    import orsd.train.replay as replay

    calls, original = [], replay.replay_logprobs
    monkeypatch.setattr(replay, "replay_logprobs", lambda *a, **k: calls.append(
        (a[1].tolist(), k.get("prefixes") is not None)) or original(*a, **k))
    records = [TurnRecord(0, [5, 6, 7, 8], [9, 10], [0.0, 0.0], 2, "", None, "", True, False, False, False)]
    paired_replay(tiny_model, records, [1.0], [[11, 12, 13]], 0.1, ReplaySpec(1.0, 4096),
                  record_controls=[[14, 15, 16]])
    assert calls == [([5, 6, 7, 8, 9, 10], False),  # the plain pass, then B*'s and the control's sequences
                     ([5, 6, 11, 12, 13, 7, 8, 9, 10, 5, 6, 14, 15, 16, 7, 8, 9, 10], True)]


def test_a_step_with_a_control_records_it_and_measures_delta_against_it(tiny_model, tiny_tokenizer):
    """The trainer path: a scripted verifier picks B* = bundle 0; Δ on the first trajectory equals
    lp(with B*) − lp(with the fitted content-free control) by hand, groups.jsonl names the control,
    steps.jsonl has the paper's Δ beside it."""
    from test_step import ScriptedVerifier, make_trainer, lp_of_response

    config = small_config("method.name=orsd", "rubric.alpha=0.5", "rubric.delta_baseline=content_free")
    trainer = make_trainer(config, tiny_model, tiny_tokenizer, ScriptedVerifier())
    initial = frozen_copy(tiny_model)
    result = trainer.step()
    out, m = result.outputs, result.metrics
    b_star = out.candidates[0].bundles[0]
    control = out.controls[0].bundle
    assert control.criteria == content_free_bundle(b_star).criteria
    assert result.records[0]["control"] == {"kind": "content_free", "criteria": control.criteria, "reason": ""}
    b_ids = rubric_ids(tiny_tokenizer, rubric.rubric_context(b_star), "system")
    c_ids = deltas.control_ids(tiny_tokenizer, control, len(b_ids), None, "system")
    for index, record in enumerate(result.groups[0].trajectories[0].records):
        def at(ids):
            return record.context_ids[:record.rubric_slot] + ids + record.context_ids[record.rubric_slot:]
        with_b = lp_of_response(initial, at(b_ids), record.response_ids, 1.0)
        with_c = lp_of_response(initial, at(c_ids), record.response_ids, 1.0)
        start = int(out.replay.packed.cu_seqlens[index]) + len(record.context_ids)
        span = slice(start, start + len(record.response_ids))
        assert out.replay.valid[span].all()
        assert out.replay.delta[span].double() == pytest.approx(with_b - with_c, abs=1e-5)
    valid = out.replay.valid
    assert m["delta_mean"] == pytest.approx(float(out.replay.delta[valid].mean()))
    assert m["delta_paper_mean"] == pytest.approx(float(out.replay.delta_paper[valid].mean()))
    assert m["delta_paper_abs_mean"] > 0 and m["delta_paper_mean"] != m["delta_mean"]


def test_without_a_control_the_step_records_none_and_no_paper_delta(tiny_model, tiny_tokenizer):
    from test_step import ScriptedVerifier, make_trainer

    config = small_config("method.name=orsd")
    result = make_trainer(config, tiny_model, tiny_tokenizer, ScriptedVerifier()).step()
    assert all(r["control"] is None for r in result.records)
    assert "delta_paper_mean" not in result.metrics and result.outputs.replay.delta_paper is None
    assert {"shaping_ratio_mean", "shaping_ratio_median", "shaping_ratio_p90",
            "delta_first_token_mean"} <= set(result.metrics)


@pytest.mark.parametrize("override, message", [
    ("rubric.delta_baseline=random", "rubric.delta_baseline='random' is invalid: expected one of none | content_free "
                                     "| rejected | shuffled"),
    ("rubric.delta_mask=tags", "rubric.delta_mask='tags' is invalid: expected one of none | format"),
])
def test_the_new_keys_refuse_other_values_in_one_line_naming_the_key(override, message):
    from orsd.train.config import ConfigError, load_config

    with pytest.raises(ConfigError) as raised:
        load_config(None, [override])
    assert str(raised.value) == "command line: " + message and raised.value.key == override.split("=")[0]
    config = load_config(None, ["rubric.delta_baseline=shuffled", "rubric.delta_mask=format"])
    assert (config.rubric.delta_baseline, config.rubric.delta_mask) == ("shuffled", "format")
    assert (Config().rubric.delta_baseline, Config().rubric.delta_mask) == ("none", "none")  # the paper


def test_the_joined_pass_shares_b_stars_and_the_controls_stems_as_two_passes_would(tiny_model):
    """A group's first turns agree up to the slot: B*'s rows share B*'s message, the control's rows
    the control's, both only the template's header. The joined pass forwards each side's stem once
    (prefill.shared_stems splits the set where B* and the control part), so it forwards no more
    tokens than B*'s pass and the control's pass apart; Δ as whole forwards give it (fp32)."""
    from test_shared_prefix import tokens_forwarded

    rng = random.Random(5)
    header = [61, 62, 63, 64]
    b_star = header + [rng.randrange(3, 60) for _ in range(60)]
    control = header + [rng.randrange(3, 60) for _ in range(60)]
    records = []
    for _ in range(2):  # two tasks, three first turns each: the same context up to the slot
        context = [rng.randrange(3, 60) for _ in range(rng.randint(8, 15))] + [70, 71]
        records += [TurnRecord(0, context, response, [0.0] * len(response), len(context) - 2, "", None, "", True,
                               False, False, False)
                    for response in ([rng.randrange(3, 60) for _ in range(rng.randint(1, 4))] for _ in range(3))]
    advantages = [1.0, 0.0, -1.0] * 2
    tiny_model.eval()

    def run(rubrics, controls=None):
        plain = plain_replay(tiny_model, records, ReplaySpec(1.0, 4096), keep_prefixes=True)
        return tokens_forwarded(tiny_model, lambda: paired_replay(
            tiny_model, records, advantages, rubrics, 0.5, ReplaySpec(1.0, 4096), plain=plain, record_controls=controls))

    joined, joined_tokens = run([b_star] * 6, [control] * 6)
    _, b_star_tokens = run([b_star] * 6)
    _, control_tokens = run([control] * 6)
    assert joined_tokens <= b_star_tokens + control_tokens
    assert b_star_tokens < 6 * len(b_star)  # each side's message forwarded once per task, not per record
    whole = paired_replay(tiny_model, records, advantages, [b_star] * 6, 0.5,
                          ReplaySpec(1.0, 4096, share_prefix=False), record_controls=[control] * 6)
    assert joined.valid.sum() > 0 and torch.equal(joined.valid, whole.valid)
    torch.testing.assert_close(joined.delta, whole.delta, rtol=0, atol=4e-5)
    torch.testing.assert_close(joined.delta_paper, whole.delta_paper, rtol=0, atol=4e-5)


def content_free_step(method, model, tokenizer, tmp_path):
    from test_step import ScriptedVerifier, make_trainer

    rubric_file = tmp_path / "rubric.yaml"
    rubric_file.write_text("- The agent searches with the task's words.\n- The agent buys a matching item.\n")
    config = small_config(f"method.name={method}", "rubric.delta_baseline=content_free",
                          f"method.rubric_file={rubric_file}" if method == "static_rubric" else "rubric.alpha=0.01")
    return make_trainer(config, model, tokenizer, ScriptedVerifier()).step()  # grpo_opsd selects B* by ρ


@pytest.mark.parametrize("method", ["single_bundle", "random_bundle", "offline_rubric", "static_rubric"])
def test_the_switch_acts_alike_in_every_method_that_writes_bundles(method, tiny_model, tiny_tokenizer, tmp_path):
    """content_free in the ablations and static_rubric: each group has its B* (these methods use their
    bundle whatever the rewards), so each gets a control and every reply token a Δ against it."""
    result = content_free_step(method, tiny_model, tiny_tokenizer, tmp_path)
    assert all(c is not None and c.bundle is not None for c in result.outputs.controls)
    assert [r["control"]["kind"] for r in result.records] == ["content_free"] * len(result.records)
    replay = result.outputs.replay
    assert replay.valid[replay.packed.response_mask].all()
    assert "delta_paper_mean" in result.metrics and not torch.equal(replay.delta, replay.delta_paper)


@pytest.mark.parametrize("method", ["grpo_opsd", "grpo"])
def test_the_opsd_family_and_grpo_are_unaffected(method, tiny_model, tiny_tokenizer, tmp_path):
    """The OPSD family's teacher splices its own context (no Δ pass); GRPO has no rubric: no control."""
    result = content_free_step(method, tiny_model, tiny_tokenizer, tmp_path)
    assert result.outputs.controls == [None] * len(result.groups)
    assert all(r["control"] is None for r in result.records)
    assert "delta_paper_mean" not in result.metrics and not result.outputs.replay.valid.any()
