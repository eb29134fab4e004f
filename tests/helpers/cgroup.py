"""A real cgroup with a CPU quota, for the tests and the benchmark of model.threads under a quota
(orsd/train/cpu_quota.py). Making one needs root and a writable cgroup mount with the cpu
controller (v1, or v2 with cpu in the root's subtree_control)."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from orsd.train.cpu_quota import cpu_mounts


def writable_cpu_cgroup() -> Path | None:
    """The mount point of a writable cgroup hierarchy with the cpu controller, or None."""
    if os.geteuid() != 0:
        return None
    for _, mount_point, version in cpu_mounts(Path("/proc/self/mountinfo").read_text().splitlines()):
        point = Path(mount_point)
        if not os.access(point, os.W_OK):
            continue
        if version == 1 or "cpu" in (point / "cgroup.subtree_control").read_text().split():
            return point
    return None


@contextlib.contextmanager
def quota_group(cpus: float, period_us: int = 100_000):
    """A fresh cgroup limited to `cpus` CPUs' worth of time per period, removed after (its processes
    must have exited). Yields the shell prefix that moves a command into it:
    `["sh", "-c", 'echo $$ > <group>/cgroup.procs && exec "$0" "$@"']` + command."""
    mount = writable_cpu_cgroup()
    if mount is None:
        raise RuntimeError("no writable cgroup mount with the cpu controller (root needed)")
    group = mount / f"orsd-quota-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        quota = str(round(cpus * period_us))
        if (group / "cpu.max").exists():
            (group / "cpu.max").write_text(f"{quota} {period_us}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period_us))
            (group / "cpu.cfs_quota_us").write_text(quota)
        yield group, ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"']
    finally:
        group.rmdir()
