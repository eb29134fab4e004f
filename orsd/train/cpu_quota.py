"""The CPU time this process may use under a cgroup quota (`docker run --cpus`, a Kubernetes CPU
limit, systemd's CPUQuota), on Linux with cgroup v1 or v2.

Torch starts one OpenMP thread per core it can see, and a quota hides no core: a container limited
to 2 CPUs on a 64-core host runs 64 threads that the kernel throttles to 2 cores' worth of time per
period, each parallel region then waiting for the throttled threads at its barrier. Affinity
(`taskset`, cpusets) is different: OpenMP already keeps to it. `model.threads: 0` follows the quota
where OMP_NUM_THREADS is not set (precision.configure_threads).

The limit is the smallest quota / period on the way from this process's cgroup up to the root of
the hierarchy it can see (a parent's limit binds its children), as the kernel applies it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple


class Quota(NamedTuple):
    cpus: float  # quota / period: how many CPUs' worth of time per period
    source: str  # the file that sets it


def cpu_quota(proc: Path | str = "/proc/self") -> Quota | None:
    """The binding CFS quota of this process's cgroup (None: no quota, not Linux, or not readable).
    `proc`: /proc/self, or a directory laid out like it (tests)."""
    proc = Path(proc)
    try:
        mounts = (proc / "mountinfo").read_text().splitlines()
        groups = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for mount_root, mount_point, version in cpu_mounts(mounts):
        path = _group_path(groups, version)
        if path is None:
            continue
        limits += _limits_up(Path(mount_point), _relative(path, mount_root), version)
    return min(limits, default=None)


def threads_for(quota: Quota) -> int:
    """Threads that fit a quota: its whole CPUs, at least one (as Go's automaxprocs rounds)."""
    return max(1, math.floor(quota.cpus))


def cpu_mounts(mountinfo: list[str]):
    """(root in the hierarchy, mount point, 1 or 2) of the cgroup mounts with the cpu controller.
    A mountinfo line: `id parent major:minor root mount-point options [optional...] - type source super-options`."""
    for line in mountinfo:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            yield fields[3], fields[4], 2
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(","):
            yield fields[3], fields[4], 1


def _group_path(groups: list[str], version: int) -> str | None:
    """This process's path in the hierarchy: `/proc/self/cgroup`'s `0::path` (v2) or the line whose
    controllers include cpu (v1)."""
    for line in groups:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if version == 2 and number == "0" and controllers == "":
            return path
        if version == 1 and "cpu" in controllers.split(","):
            return path
    return None


def _relative(path: str, mount_root: str) -> Path:
    """`path` below the mount's root; the mount point itself where the process sits outside what is
    mounted (a container's namespace shows its own group as the root)."""
    try:
        return Path(path).relative_to(mount_root)
    except ValueError:
        return Path()


def _limits_up(mount_point: Path, relative: Path, version: int) -> list[Quota]:
    limits, here = [], mount_point / relative
    while True:
        limit = _read_v2(here) if version == 2 else _read_v1(here)
        if limit is not None:
            limits.append(limit)
        if here == mount_point or mount_point not in here.parents:
            return limits
        here = here.parent


def _read_v2(directory: Path) -> Quota | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else _quota(quota, period, directory / "cpu.max")


def _read_v1(directory: Path) -> Quota | None:
    try:
        quota = (directory / "cpu.cfs_quota_us").read_text().strip()
        period = (directory / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _quota(quota, period, directory / "cpu.cfs_quota_us")


def _quota(quota: str, period: str, source: Path) -> Quota | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return Quota(q / p, str(source)) if q > 0 and p > 0 else None  # -1: no quota (v1)
