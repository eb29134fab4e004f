"""model.threads=0 under a cgroup CPU quota: read from a real cgroup where this machine lets the test
make one, and from laid-out /proc and cgroup files for the v1/v2 cases one machine cannot show."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cgroup import quota_group, writable_cpu_cgroup
from orsd.train.cpu_quota import Quota, cpu_quota, threads_for


def layout(tmp_path: Path, mounts: list[str], groups: list[str], files: dict[str, str]) -> Path:
    """A /proc/self of `mounts` (mountinfo lines, `{root}` for tmp_path) and `groups`
    (/proc/self/cgroup lines), and cgroup files under tmp_path."""
    proc = tmp_path / "proc"
    proc.mkdir(parents=True)
    (proc / "mountinfo").write_text("\n".join(m.format(root=tmp_path) for m in mounts) + "\n")
    (proc / "cgroup").write_text("\n".join(groups) + "\n")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return proc


V2_MOUNT = "30 23 0:26 / {root}/unified rw,nosuid - cgroup2 cgroup2 rw"
V1_MOUNT = "32 31 0:29 / {root}/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct"


def test_v2_quota_of_the_process_group(tmp_path):
    proc = layout(tmp_path, [V2_MOUNT], ["0::/pod/app"], {"unified/pod/app/cpu.max": "250000 100000\n"})
    assert cpu_quota(proc) == Quota(2.5, str(tmp_path / "unified/pod/app/cpu.max"))
    assert threads_for(cpu_quota(proc)) == 2


def test_v2_a_parent_limit_binds_and_max_is_none(tmp_path):
    proc = layout(tmp_path, [V2_MOUNT], ["0::/pod/app"],
                  {"unified/pod/cpu.max": "150000 100000\n", "unified/pod/app/cpu.max": "max 100000\n"})
    assert cpu_quota(proc).cpus == 1.5
    unlimited = layout(tmp_path / "u", [V2_MOUNT], ["0::/pod/app"], {"unified/pod/app/cpu.max": "max 100000\n"})
    assert cpu_quota(unlimited) is None


def test_v1_quota_with_combined_controllers_and_minus_one_unlimited(tmp_path):
    proc = layout(tmp_path, [V1_MOUNT], ["4:memory:/x", "2:cpu,cpuacct:/docker/abc"],
                  {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                   "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                   "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(proc) == Quota(0.5, str(tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us"))
    assert threads_for(cpu_quota(proc)) == 1  # at least one


def test_a_container_sees_its_own_group_at_the_mount_point(tmp_path):
    """In a cgroup namespace /proc/self/cgroup may name a path the mount does not hold; the limit is
    then the mount point's own."""
    mount = "40 39 0:29 /docker/abc {root}/cpu rw - cgroup cgroup rw,cpu"
    proc = layout(tmp_path, [mount], ["1:cpu:/"], {"cpu/cpu.cfs_quota_us": "200000\n",
                                                     "cpu/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(proc).cpus == 2.0


def test_no_cpu_controller_or_no_proc_means_no_quota(tmp_path):
    memory_only = "33 31 0:30 / {root}/memory rw - cgroup cgroup rw,memory"
    assert cpu_quota(layout(tmp_path, [memory_only], ["4:memory:/"], {})) is None
    assert cpu_quota(tmp_path / "absent") is None


@pytest.fixture
def quota_prefix():
    """A real cgroup of 0.5 CPUs for the test's child processes (helpers/cgroup.py), removed after."""
    if writable_cpu_cgroup() is None:
        pytest.skip("making a cgroup needs root and a writable cgroup mount with the cpu controller")
    with quota_group(0.5) as (group, prefix):
        yield group, prefix


def test_a_real_quota_lowers_torchs_threads_unless_the_user_chose(quota_prefix):
    group, prefix = quota_prefix
    code = ("import json, torch; from orsd.train.precision import configure_threads\n"
            "seen = torch.get_num_threads(); chosen = configure_threads(0)\n"
            "print(json.dumps([seen, chosen.count, chosen.reason]))\n")

    def child(**env):
        base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env={**base, **env})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    seen, count, reason = child()
    if seen < 2:
        pytest.skip("torch sees one core here: no quota can lower that")
    assert count == 1 and "0.5 CPUs" in reason and str(group) in reason
    assert child(OMP_NUM_THREADS="2")[1:] == [2, "OMP_NUM_THREADS"]  # the user chose: the quota changes nothing
