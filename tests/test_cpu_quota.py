"""The CPUs a cgroup's quota lets a python model keep busy (`models/shared/cpu_quota.py`), read from cgroup trees
written as the kernel lays them out (v2 `cpu.max`; v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), and the sessions
that size their threads by it."""

from __future__ import annotations

import os

import pytest

from tritonpack.components import load_model_module

cpu_quota = load_model_module("framework_runner", "cpu_quota")


@pytest.fixture
def sixteen_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))


def cgroups(tmp_path, membership: str, files: dict[str, str]) -> dict[str, str]:
    for relative, content in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(content + "\n")
    (tmp_path / "self-cgroup").write_text(membership + "\n")
    return {"root": str(tmp_path / "fs"), "membership": str(tmp_path / "self-cgroup")}


@pytest.mark.parametrize(("membership", "files", "limit"), [
    # cgroup v2, a Kubernetes container with a limit of 1.5 CPUs: rounded up
    ("0::/kubepods/pod1/ctr", {"fs/kubepods/pod1/ctr/cpu.max": "150000 100000"}, 2),
    # v2: the pod's limit binds a container without one of its own
    ("0::/kubepods/pod1/ctr", {"fs/kubepods/pod1/cpu.max": "100000 100000",
                               "fs/kubepods/pod1/ctr/cpu.max": "max 100000"}, 1),
    # v2 in a cgroup namespace (`docker run --cpus 3`): the path is / and the mount is the container's cgroup
    ("0::/", {"fs/cpu.max": "300000 100000"}, 3),
    # cgroup v1, the cpu and cpuacct controllers mounted together
    ("4:cpu,cpuacct:/docker/abc", {"fs/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000",
                                   "fs/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"}, 3),
    # v1 without a cgroup namespace: the host's path is not under the container's mount, whose top is its cgroup
    ("1:cpu:/docker/abc", {"fs/cpu/cpu.cfs_quota_us": "200000", "fs/cpu/cpu.cfs_period_us": "100000"}, 2),
    # a quota below one CPU still runs one thread
    ("1:cpu:/tp", {"fs/cpu/tp/cpu.cfs_quota_us": "50000", "fs/cpu/tp/cpu.cfs_period_us": "100000"}, 1),
])
def test_cpu_limit_is_the_smallest_quota_on_the_process_cgroups_rounded_up(tmp_path, sixteen_cpus, membership, files,
                                                                          limit):
    assert cpu_quota.cpu_limit(**cgroups(tmp_path, membership, files)) == limit


@pytest.mark.parametrize(("membership", "files"), [
    ("0::/kubepods/pod1/ctr", {"fs/kubepods/pod1/ctr/cpu.max": "max 100000"}),  # v2: no quota
    ("1:cpu:/", {"fs/cpu/cpu.cfs_quota_us": "-1", "fs/cpu/cpu.cfs_period_us": "100000"}),  # v1: no quota
    ("0::/ctr", {"fs/ctr/cpu.max": "3200000 100000"}),  # a quota of 32 CPUs on 16: the affinity binds
    ("0::/ctr", {"fs/ctr/cpu.max": "not a quota"}),
    ("3:memory:/ctr", {"fs/memory/ctr/cpu.cfs_quota_us": "100000"}),  # not the cpu controller's hierarchy
    ("0::/ctr", {}),  # nothing to read
])
def test_cpu_limit_is_none_where_no_quota_is_below_the_affinity(tmp_path, sixteen_cpus, membership, files):
    assert cpu_quota.cpu_limit(**cgroups(tmp_path, membership, files)) is None


def test_cpu_limit_is_none_where_the_process_cgroups_cannot_be_read(tmp_path):
    assert cpu_quota.cpu_limit(str(tmp_path), str(tmp_path / "absent")) is None


def test_torchscript_session_runs_as_many_threads_as_the_quota_allows_when_threads_are_not_set(tmp_path, monkeypatch):
    import torch

    session_module = load_model_module("framework_runner", "torchscript_session")
    torch.jit.trace(torch.nn.Linear(4, 2).eval(), torch.zeros(1, 4)).save(str(tmp_path / "model.pt"))
    before = torch.get_num_threads()
    monkeypatch.setattr(session_module, "cpu_limit", lambda: 1)
    try:
        session_module.open_session(str(tmp_path / "model.pt"), {"input_order": "x", "output_order": "y"})
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
