"""grpo_advantages: GRPO's group-normalised outcome advantage, one value per trajectory."""

from __future__ import annotations

import torch

from . import _backend, _checks, reference


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """A[i] = (r_i - mean_g) / (std_g + eps) over i's group g (sample std, n - 1), or r_i - mean_g
    when not norm_by_std; 0 for a group of one or a constant group.

    rewards [N] f32 (finite), group_ids [N] int64 >= 0 (ids may skip numbers: empty groups are
    fine). Statistics in f64, result [N] f32. One host sync on CUDA (checks + number of groups).
    """
    rewards = _checks.tensor("rewards", rewards, dtypes=(torch.float32,), ndim=1)
    device = rewards.device
    group_ids = _checks.tensor(
        "group_ids", group_ids, dtypes=(torch.int64,), ndim=1, device=device, device_of="rewards"
    )
    _checks.length("group_ids", group_ids, rewards.shape[0], "one group id per reward")
    eps = _checks.real("eps", eps, nonnegative=True)
    if not isinstance(norm_by_std, bool):
        raise ValueError(f"norm_by_std: expected a bool, got {norm_by_std!r}")
    n = rewards.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)

    checks = _checks.ValueChecks()
    checks.out_of_range("group_ids", group_ids, 0, 2**62, note=" (a non-negative group id)")
    not_finite = ~torch.isfinite(rewards)
    checks.add(not_finite, lambda: _checks.first_bad("rewards", rewards, not_finite, "a finite reward"))
    (max_group,) = checks.run(fetch=[group_ids.max()])
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
