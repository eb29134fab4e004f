"""The hf engine's prefill (engines/prefill.py, engines/tree.py): repeated prompts forwarded once,
shared prefixes once on one row, the prefix tree and its trunks, the branches of a trunk in one
forward; every row decodes what it decodes alone."""

import pytest
import torch
from helpers.transformers_reference import transformers_generate

from orsd.engines.base import Sampling
from orsd.engines.hf import HfEngine


def prefill_shapes(model, run):
    """The [rows, tokens] of every decoder forward while `run()` runs, and what it returned."""
    shapes = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        return shapes, run()
    finally:
        hook.remove()


def test_repeated_prompts_are_prefilled_once(tiny_model, tiny_tokenizer):
    """[A, A, B, A]: each distinct prompt forwarded once (the two, sharing nothing, in one batch:
    padding 7 tokens costs less than a second forward), and every row decodes what it decodes
    alone (greedy, fp32)."""
    a = tiny_tokenizer.encode("Task: put a clean apple in the fridge.", add_special_tokens=False)
    b = tiny_tokenizer.encode("the agent clicks", add_special_tokens=False)
    assert a[0] != b[0]  # nothing shared: two prefills
    model = tiny_model.eval()
    engine = HfEngine(model, tiny_tokenizer)
    sampling = Sampling(max_new_tokens=10, greedy=True)
    shapes, together = prefill_shapes(model, lambda: engine.generate([a, a, b, a], sampling))
    assert shapes[0] == (2, len(a)) and all(s == (4, 1) for s in shapes[1:])
    alone = {name: engine.generate([prompt], sampling)[0] for name, prompt in (("a", a), ("b", b))}
    for name, generation in zip("aaba", together):
        assert generation.ids == alone[name].ids and len(generation.ids) > 1
        assert generation.logprobs == pytest.approx(alone[name].logprobs, abs=1e-5)


def test_prefix_tree_splits_where_prompts_diverge():
    from orsd.engines.tree import prefix_tree

    prompts = [[1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 6, 7], [9, 8]]
    root = prefix_tree(prompts)
    assert (root.start, root.end) == (0, 0) and [c.prompts for c in root.children] == [[0, 1, 2], [3]]
    shared = root.children[0]
    assert (shared.start, shared.end) == (0, 2)  # [1, 2]
    assert [(c.start, c.end, c.prompts) for c in shared.children] == [(2, 3, [0, 1]), (2, 4, [2])]
    # [1, 2, 3, 4] is a prefix of [1, 2, 3, 4, 5]: the segment stops one short, so it keeps its last token
    assert [(c.start, c.end, c.prompts) for c in shared.children[0].children] == [(3, 4, [0]), (3, 5, [1])]
    for bad in ([[1, 2], [1, 2]], [[1], []]):
        with pytest.raises(ValueError, match="distinct, non-empty"):
            prefix_tree(bad)


def test_a_chain_of_segments_is_one_trunk_with_its_branches_hanging_off_it():
    """Three sequences branching off one trajectory at different depths (as a rubric spliced at each
    turn's slot does): the prefix tree is a chain of segments; `trunks` makes it one trunk, with
    every branch hanging off it at its own start."""
    from orsd.engines.tree import Node, prefix_tree, trunks

    trajectory = list(range(10, 24))
    prompts = [trajectory[:5] + [90, 91], trajectory[:9] + [92, 93], trajectory]
    first = [5, 9, 12]
    root = prefix_tree(prompts, first)
    hanging = trunks(Node(0, 0, root.prompts, [root]), prompts)
    assert len(hanging) == 1 and hanging[0].items is not None
    trunk = hanging[0]
    assert (trunk.start, trunk.tokens) == (0, trajectory[:9])  # down to the last divergence
    assert sorted((item.start, item.tokens, item.items) for item in trunk.items) == [
        (5, [90, 91], None), (9, trajectory[9:], None), (9, [92, 93], None)]


def test_branches_at_different_depths_take_one_forward_and_equal_whole_forwards(tiny_model):
    """The trunk's forward, then its branches in one batch, each row masked past its own start:
    two forwards in all, and every needed hidden state what the sequence's own forward gives (fp32)."""
    from orsd.engines.prefill import shared_prefix_hidden

    trajectory = list(range(10, 40))
    sequences = [trajectory[:8] + [90, 91, 92], trajectory[:17] + [93, 94], trajectory[:25] + [95], trajectory]
    needed = [[8, 9, 10], [16, 17, 18], [24, 25], [26, 29]]
    model = tiny_model.eval()
    with torch.no_grad():
        shapes, hidden = prefill_shapes(model, lambda: shared_prefix_hidden(model, sequences, needed))
        for sequence, positions, rows in zip(sequences, needed, hidden):
            alone = model.get_decoder()(input_ids=torch.tensor([sequence])).last_hidden_state[0]
            torch.testing.assert_close(rows, alone[positions], rtol=0, atol=1e-5)
    # the trunk up to the first position the deepest branch needs, then the four branches
    assert shapes == [(1, 24), (4, 6)]


def test_shared_prefixes_are_prefilled_once_and_decode_as_alone(tiny_model, tiny_tokenizer):
    """A group's prompts share a prefix: it is forwarded once on one row, then their remainders and
    an unrelated prompt together as one batch on its keys/values (the unrelated row masked off
    them); each row decodes what it decodes alone (greedy, fp32), at temperature 1 too (the same
    seed, the same ids as the left-padded batch of transformers)."""
    shared, x, y, other = list(range(10, 30)), [40, 41, 42], [43, 44, 45], [60, 61, 62, 63, 64]
    prompts = [shared + x, shared + x, shared + y, other]
    model = tiny_model.eval()
    engine = HfEngine(model, tiny_tokenizer)
    sampling = Sampling(max_new_tokens=8, greedy=True)
    shapes, together = prefill_shapes(model, lambda: engine.generate(prompts, sampling))
    assert shapes[:2] == [(1, len(shared)), (3, len(other))]
    assert all(s == (4, 1) for s in shapes[2:])
    for prompt, generation in zip(prompts, together):
        alone = engine.generate([prompt], sampling)[0]
        assert generation.ids == alone.ids and len(generation.ids) > 1
        assert generation.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    sampling = Sampling(temperature=1.0, max_new_tokens=8)
    torch.manual_seed(5)
    expected_ids, expected_logprobs = transformers_generate(model, prompts, engine.pad_id, engine.stop_ids, sampling)
    torch.manual_seed(5)
    for row, generation in enumerate(engine._generate_batch(prompts, sampling)):
        assert generation.ids == expected_ids[row, :len(generation.ids)].tolist()
        assert generation.logprobs == pytest.approx(expected_logprobs[row, :len(generation.ids)].tolist(), abs=1e-5)
