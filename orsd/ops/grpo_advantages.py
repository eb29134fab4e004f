"""grpo_advantages: GRPO's group-normalised outcome advantage, one value per trajectory."""

from __future__ import annotations

import torch

from . import _backend, _checks, reference


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """A[i] = (r_i - mean_g) / (std_g + eps) over i's group g (sample std, n - 1), or r_i - mean_g
    when not norm_by_std; 0 for a group of one or a constant group.

    rewards [N] f32 (finite), group_ids [N] int64 >= 0: any such values, they only say which
    rewards belong together (ids may skip numbers; sparse ids such as hashes up to 2^63 - 1 are
    renumbered 0..G-1 first, at the cost of a sort and one more host sync). Negative ids are
    refused: -1 and -100 are the usual padding markers, and pooling every padded entry into one
    "group" would normalise unrelated trajectories against each other without a word.
    Statistics in f64, result [N] f32. One host sync on CUDA (checks + largest id).
    """
    rewards = _checks.tensor("rewards", rewards, dtypes=(torch.float32,), ndim=1)
    device = rewards.device
    group_ids = _checks.tensor(
        "group_ids", group_ids, dtypes=(torch.int64,), ndim=1, device=device, device_of="rewards"
    )
    _checks.length("group_ids", group_ids, rewards.shape[0], "one group id per reward")
    eps = _checks.real("eps", eps, nonnegative=True)
    norm_by_std = _checks.flag("norm_by_std", norm_by_std)
    n = rewards.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)

    checks = _checks.ValueChecks()
    negative = group_ids < 0
    checks.add(
        negative,
        lambda: _checks.first_bad(
            "group_ids", group_ids, negative, "a group id >= 0 (negative ids mean padding, not a group)"
        ),
    )
    not_finite = ~torch.isfinite(rewards)
    checks.add(not_finite, lambda: _checks.first_bad("rewards", rewards, not_finite, "a finite reward"))
    (max_group,) = checks.run(fetch=[group_ids.max()])
    if max_group >= n:
        # The kernels keep statistics for every id up to the largest (3 f64 per id on CPU, one
        # block per id on CUDA): with ids near 2^40 that is terabytes. N rewards have at most N
        # distinct groups, so renumber them densely; the result does not depend on the labels.
        distinct, group_ids = torch.unique(group_ids, return_inverse=True)
        num_groups = distinct.shape[0]
    else:
        num_groups = max_group + 1

    kind = _backend.native_kind(device)
    if kind is None:
        _backend.warn_reference("grpo_advantages")
        return reference.grpo_advantages(rewards, group_ids, eps, norm_by_std)
    out = torch.empty(n, dtype=torch.float32, device=device)
    if kind == "cpu":
        workspace = torch.empty(3 * num_groups, dtype=torch.float64)
        _backend._C.grpo_advantages_cpu(
            rewards.data_ptr(), group_ids.data_ptr(), n, num_groups, eps, norm_by_std,
            workspace.data_ptr(), out.data_ptr(),
        )  # fmt: skip
    else:
        _backend._C.grpo_advantages_cuda(
            rewards.data_ptr(), group_ids.data_ptr(), n, num_groups, eps, norm_by_std,
            out.data_ptr(), *_backend.cuda_launch_args(rewards),
        )  # fmt: skip
    return out
