"""Turn records packed back to back, and privileged context spliced into a packing.

`ids[cu_seqlens[s]:cu_seqlens[s+1]]` is record s's context + response; `response_mask` marks the
sampled response tokens (the only ones scored). A spliced packing (`splice_privileged`) holds
`context[:slot] + privileged + context[slot:] + response` per record: the rubric B* of paired
replay (paper §3.3), a control context (rubric.delta_baseline) or a distillation teacher's context.
Batching sequences by a token budget lives here too: every pass that forwards a packing uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orsd import ops

from .records import TurnRecord


@dataclass
class Packed:
    ids: torch.Tensor  # [L] int64
    cu_seqlens: torch.Tensor  # [S+1] int64
    response_mask: torch.Tensor  # [L] bool: positions holding sampled response tokens
    seq_ids: torch.Tensor  # [L] int64: record index of each position

    @property
    def lengths(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()

    @property
    def num_sequences(self) -> int:
        return len(self.cu_seqlens) - 1


def pack(records: list[TurnRecord]) -> Packed:
    ids, mask, seq_ids, cu = [], [], [], [0]
    for s, record in enumerate(records):
        ids += record.context_ids + record.response_ids
        mask += [False] * len(record.context_ids) + [True] * len(record.response_ids)
        seq_ids += [s] * record.num_tokens
        cu.append(len(ids))
    return Packed(torch.tensor(ids, dtype=torch.long), torch.tensor(cu, dtype=torch.long),
                  torch.tensor(mask, dtype=torch.bool), torch.tensor(seq_ids, dtype=torch.long))


def spliced_response_mask(packed: Packed, length: int, pos_map: torch.Tensor,
                          eligible: torch.Tensor) -> torch.Tensor:
    """Response positions, in the spliced packing, of the sequences that received a rubric."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[pos_map[packed.response_mask & eligible[packed.seq_ids]]] = True
    return mask


@dataclass
class Spliced:
    """A packing with privileged context spliced at each eligible record's slot."""

    ids: torch.Tensor
    cu_seqlens: torch.Tensor
    pos_map: torch.Tensor  # [L] plain position -> position in the spliced packing
    eligible: torch.Tensor  # [S] bool: the record received its privileged ids
    response_mask: torch.Tensor  # spliced positions of the eligible records' response tokens


def splice_privileged(packed: Packed, records: list[TurnRecord], privileged: list[list[int] | None]) -> Spliced:
    """`context[:slot] + privileged[s] + context[slot:] + response` per record s with ids (the rubric
    B* for paired replay, a distillation teacher's context); identical ids are stored once."""
    index, table, table_cu = [], [], [0]
    seen: dict[tuple, int] = {}
    for ids in privileged:
        if ids is None:
            index.append(-1)
            continue
        key = tuple(ids)
        if key not in seen:
            seen[key] = len(seen)
            table += ids
            table_cu.append(len(table))
        index.append(seen[key])
    index_tensor = torch.tensor(index, dtype=torch.long)
    slots = torch.tensor([max(r.rubric_slot, 0) for r in records], dtype=torch.long)
    new_ids, new_cu, pos_map = ops.splice_rubric(packed.ids, packed.cu_seqlens, slots,
                                                 torch.tensor(table, dtype=torch.long),
                                                 torch.tensor(table_cu, dtype=torch.long), index_tensor)
    eligible = index_tensor >= 0
    return Spliced(new_ids, new_cu, pos_map, eligible, spliced_response_mask(packed, len(new_ids), pos_map, eligible))


def budget_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Sequence indices grouped (sorted by length) so count × longest ≤ token_budget."""
    order = sorted(range(len(lengths)), key=lambda s: lengths[s])
    batches, current = [], []
    for s in order:
        if current and (len(current) + 1) * lengths[s] > token_budget:
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches


def batch_positions(packed_ids_mask: torch.Tensor, cu: torch.Tensor, batch: list[int]) -> list[torch.Tensor]:
    """Global positions of the response tokens of each sequence in `batch` (never a sequence's
    first token, which nothing predicts)."""
    out = []
    for s in batch:
        start, end = int(cu[s]), int(cu[s + 1])
        local = packed_ids_mask[start:end].nonzero().squeeze(-1)
        out.append(local[local > 0] + start)
    return out
