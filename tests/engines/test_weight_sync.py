"""Bucketing of a policy's parameters and the sync deadline, without vLLM (fast)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from orsd.engines.weight_sync import Deadline, WeightSyncTimeout, buckets, full_nbytes, gather, is_zero3, unwrap


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)  # 3200 bytes
        self.inner = torch.nn.Linear(8, 8)  # 256 + 32 bytes
        self.big = torch.nn.Linear(8, 400, bias=False)  # 12800 bytes: over any bucket below
        self.head = torch.nn.Linear(8, 100, bias=False)
        self.head.weight = self.embed.weight


def test_buckets_keep_order_bound_size_and_send_tied_weights_once():
    model = Tied()
    result = list(buckets(model, bucket_bytes=4000))
    names = [name for bucket in result for name in bucket.names]
    assert names == ["embed.weight", "inner.weight", "inner.bias", "big.weight"]
    assert [b.names for b in result] == [["embed.weight", "inner.weight", "inner.bias"], ["big.weight"]]
    assert [b.nbytes for b in result] == [3200 + 256 + 32, 12800]
    assert all(b.nbytes <= 4000 or len(b.names) == 1 for b in result)


def test_buckets_reject_a_non_positive_size():
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        next(buckets(Tied(), bucket_bytes=0))


def test_wrappers_are_unwrapped_so_names_match_the_checkpoint():
    class Wrapper(torch.nn.Module):  # the shape of DeepSpeedEngine / DDP: the model under `.module`
        def __init__(self, module):
            super().__init__()
            self.module = module

    model = Tied()
    assert unwrap(Wrapper(Wrapper(model))) is model
    assert [b.names[0] for b in buckets(Wrapper(model), 1 << 20)] == ["embed.weight"]


def test_zero3_parameters_are_sized_by_their_full_numel():
    param = torch.nn.Parameter(torch.empty(0))
    assert not is_zero3(param)
    param.ds_id, param.ds_status, param.ds_numel = 7, "NOT_AVAILABLE", 1000
    assert is_zero3(param)
    assert full_nbytes(param) == 4000


def test_gather_of_plain_parameters_shares_their_storage():
    model = Tied()
    bucket = next(buckets(model, 1 << 20))
    tensors = gather(bucket)
    assert [name for name, _ in tensors] == bucket.names
    assert tensors[0][1].data_ptr() == model.embed.weight.data_ptr()
    assert not tensors[0][1].requires_grad


def test_deadline_names_the_stage_that_ran_out_of_time():
    release = threading.Event()
    deadline = Deadline(0.3)
    started = time.monotonic()
    expected = r"timed out after 0\.3 s in stage 'load_weights' \(bucket 2\)"
    with pytest.raises(WeightSyncTimeout, match=expected) as caught:
        deadline.run("load_weights", lambda: release.wait(30), "bucket 2")
    release.set()
    assert caught.value.stage == "load_weights" and caught.value.timeout_seconds == 0.3
    assert 0.3 <= time.monotonic() - started < 1.3


def test_deadline_is_one_budget_for_all_stages():
    deadline = Deadline(0.4)
    assert deadline.run("gather", lambda: time.sleep(0.25) or "gathered") == "gathered"
    with pytest.raises(WeightSyncTimeout, match="stage 'transfer'"):
        deadline.run("transfer", lambda: time.sleep(0.3))


def test_deadline_hands_errors_and_hooks_through():
    seen = []
    deadline = Deadline(5.0, hook=seen.append)
    with pytest.raises(KeyError, match="boom"):
        deadline.run("load_weights", lambda: {}["boom"])
    assert seen == ["load_weights"]
    with pytest.raises(ValueError, match="sync_timeout_seconds=0"):
        Deadline(0)
