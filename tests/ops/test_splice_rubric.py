"""splice_rubric: equals the reference exactly, keeps every old token (pos_map), puts each rubric
at its slot, and rejects malformed packings."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from orsd.ops import reference, splice_rubric


def pack(sequences, dtype=torch.int64, device="cpu"):
    lengths = [len(s) for s in sequences]
    cu = torch.tensor([0] + torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int64)
    flat = torch.tensor([t for s in sequences for t in s], dtype=dtype)
    return flat.to(device), cu.to(device)


@st.composite
def batches(draw):
    num_seqs = draw(st.integers(0, 8))
    num_rubrics = draw(st.integers(0, 4))
    sequences = [draw(st.lists(st.integers(0, 999), max_size=12)) for _ in range(num_seqs)]
    rubrics = [draw(st.lists(st.integers(1000, 1999), max_size=6)) for _ in range(num_rubrics)]
    rubric_index = [draw(st.integers(-1, num_rubrics - 1)) for _ in range(num_seqs)]
    slots = [
        draw(st.integers(0, len(s))) if j >= 0 else draw(st.integers(-5, 50))
        for s, j in zip(sequences, rubric_index)
    ]
    return sequences, rubrics, rubric_index, slots


def call_both(sequences, rubrics, rubric_index, slots, dtype=torch.int64, device="cpu"):
    ids, cu = pack(sequences, dtype, device)
    rubric_ids, rubric_cu = pack(rubrics, dtype, device)
    args = (ids, cu, torch.tensor(slots, dtype=torch.int64, device=device), rubric_ids, rubric_cu,
            torch.tensor(rubric_index, dtype=torch.int64, device=device))  # fmt: skip
    return args, splice_rubric(*args), reference.splice_rubric(*args)


@given(batch=batches(), dtype=st.sampled_from([torch.int64, torch.int32]))
def test_matches_reference_exactly(batch, dtype):
    sequences, rubrics, rubric_index, slots = batch
    (ids, cu, *_), got, want = call_both(sequences, rubrics, rubric_index, slots, dtype)
    new_ids, new_cu, pos_map = got
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert new_ids.dtype == dtype and new_cu.dtype == torch.int64 and pos_map.dtype == torch.int64
    assert torch.equal(new_ids[pos_map], ids)  # every old token is where pos_map says
    for s, (sequence, j) in enumerate(zip(sequences, rubric_index)):
        spliced = new_ids[new_cu[s] : new_cu[s + 1]].tolist()
        expected = sequence[: slots[s]] + rubrics[j] + sequence[slots[s] :] if j >= 0 else sequence
        assert spliced == expected


def test_slot_at_start_end_and_no_rubric(device):
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], []]
    rubrics = [[100, 101], [200]]
    _, (new_ids, new_cu, pos_map), _ = call_both(
        sequences, rubrics, [0, 1, -1, 1], [0, 2, 99, 0], device=device
    )
    assert new_ids.tolist() == [100, 101, 1, 2, 3, 4, 5, 200, 6, 7, 8, 9, 200]
    assert new_cu.tolist() == [0, 5, 8, 12, 13]
    assert pos_map.tolist() == [2, 3, 4, 5, 6, 8, 9, 10, 11]


def test_empty_batch(device):
    _, (new_ids, new_cu, pos_map), _ = call_both([], [[1, 2]], [], [], device=device)
    assert new_ids.shape == (0,) and new_cu.tolist() == [0] and pos_map.shape == (0,)


def test_large_packing_matches_reference(device):
    g = torch.Generator().manual_seed(0)
    sequences = [
        torch.randint(0, 50_000, (int(n),), generator=g).tolist()
        for n in torch.randint(0, 3000, (64,), generator=g)
    ]
    rubrics = [
        torch.randint(50_000, 60_000, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 400, (8,), generator=g)
    ]
    rubric_index = torch.randint(-1, 8, (64,), generator=g).tolist()
    slots = [int(torch.randint(0, len(s) + 1, (1,), generator=g)) for s in sequences]
    _, got, want = call_both(sequences, rubrics, rubric_index, slots, device=device)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def good_args():
    ids, cu = pack([[1, 2, 3], [4, 5]])
    rubric_ids, rubric_cu = pack([[9, 9], [8]])
    return dict(ids=ids, cu_seqlens=cu, slots=torch.tensor([1, 2]), rubric_ids=rubric_ids, rubric_cu=rubric_cu,
                rubric_index=torch.tensor([0, 1]))  # fmt: skip


@pytest.mark.parametrize(
    "name, bad, message",
    [
        ("ids", torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), "dtype"),
        ("ids", torch.arange(10)[::2], "contiguous"),
        ("cu_seqlens", torch.tensor([0, 6, 5]), "non-decreasing"),
        ("cu_seqlens", torch.tensor([1, 3, 5]), "starts at 1"),
        ("cu_seqlens", torch.tensor([0, 3, 6]), "ends at 6"),
        ("cu_seqlens", torch.tensor([0, 3, 5], dtype=torch.int32), "dtype"),
        ("cu_seqlens", torch.zeros(0, dtype=torch.int64), "empty"),
        ("slots", torch.tensor([4, 2]), "slot"),
        ("slots", torch.tensor([1, 3]), "slot"),
        ("slots", torch.tensor([-1, 0]), "slot"),
        ("slots", torch.tensor([1]), "entries"),
        ("rubric_ids", torch.tensor([9, 9, 8], dtype=torch.int32), "dtype"),
        ("rubric_cu", torch.tensor([0, 2, 1, 3]), "non-decreasing"),
        ("rubric_cu", torch.tensor([0, 2, 4]), "ends at 4"),
        ("rubric_index", torch.tensor([0, 2]), r"\[-1, 2\)"),
        ("rubric_index", torch.tensor([-2, 0]), r"\[-1, 2\)"),
        ("rubric_index", torch.tensor([0, 1, 1]), "entries"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad, message):
    args = good_args()
    args[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}.*{message}"):
        splice_rubric(**args)


def test_slot_of_a_sequence_without_rubric_is_ignored():
    args = good_args()
    args["rubric_index"] = torch.tensor([0, -1])
    args["slots"] = torch.tensor([1, -7])
    new_ids, _, _ = splice_rubric(**args)
    assert new_ids.tolist() == [1, 9, 9, 2, 3, 4, 5]
