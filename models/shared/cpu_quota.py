"""The CPUs a cgroup's quota lets this process keep busy, where that is fewer than the CPUs it may run on.

A container started with `--cpus 2`, or a Kubernetes pod with a CPU limit of 2, still has every CPU of its host in
its affinity, while its cgroup grants it 2 CPUs' worth of time per period and stops every thread beyond that until
the next one (CFS throttling). A session that sizes its thread pool from the affinity alone runs, on a 32-core host,
32 threads on a quota of 2. `cpu_limit` reads the quota of this process's cgroup and of every cgroup above it:
cgroup v2's `cpu.max`, v1's `cpu.cfs_quota_us` over `cpu.cfs_period_us`. `cpu_fields`: what kind of CPU they are.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def cpu_fields() -> dict[str, str]:
    """The first CPU's /proc/cpuinfo fields (vendor_id, cpu family, model, stepping, flags, …); none where it cannot
    be read."""
    fields: dict[str, str] = {}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return fields
    for line in lines:
        key, _, value = line.partition(":")
        if not key.strip():  # the first processor's block ends here
            break
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_limit(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> int | None:
    """The smallest quota on this process's cgroups in CPUs, rounded up, where it is below the CPUs of its affinity;
    None where no quota applies or none can be read."""
    quotas = [quota for folder in _cpu_cgroup_folders(Path(root), membership) if (quota := _quota(folder)) is not None]
    if not quotas:
        return None
    limit = max(1, math.ceil(min(quotas)))
    return limit if limit < len(os.sched_getaffinity(0)) else None


def _cpu_cgroup_folders(root: Path, membership: str) -> list[Path]:
    """This process's cgroup folder for the cpu controller and each one above it, up to the mount. In a container
    with a cgroup namespace the path is `/` and the mount is the container's own cgroup; without one, the path may
    not exist under the mount, whose top is then the container's cgroup."""
    try:
        lines = Path(membership).read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one hierarchy
            mount = root
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's hierarchy
            mount = root / controllers if (root / controllers).is_dir() else root / "cpu"
        else:
            continue
        folder = mount / path.lstrip("/")
        folders.append(folder)
        while mount in folder.parents:
            folder = folder.parent
            folders.append(folder)
    return folders


def _quota(folder: Path) -> float | None:
    """CPUs' worth of time per period this cgroup allows; None without a quota."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        return quota / int((folder / "cpu.cfs_period_us").read_text()) if quota > 0 else None
    except (OSError, ValueError):
        return None
