"""The hand computation the step's Δ is checked against: log π of a response after a context, from
one plain forward of the model (tests/train/test_step.py, tests/methods/test_static_rubric.py)."""

from __future__ import annotations

import torch


def lp_of_response(model, context, response, temperature):
    """log π of each response token after `context`, from one plain forward (the hand computation)."""
    ids = context + response
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double() / temperature
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    return lp[-len(response):]
