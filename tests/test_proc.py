"""`tritonpack.proc` reads real processes: group members (zombies too), CPU seconds, RSS vs PSS, stub command lines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tritonpack import proc

MB = 1024  # kB

# A child that maps (and touches) a /dev/shm file, says so, and waits for stdin to close.
SHARE = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
region = mmap.mmap(fd, 0)
for offset in range(0, len(region), 4096):
    region[offset] = 1
print("mapped", flush=True)
sys.stdin.read()
"""


def start(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)


def finish(*children: subprocess.Popen) -> None:
    for child in children:
        child.stdin.close()
        child.wait(timeout=30)
        child.stdout.close()


def test_group_members_lists_a_group_and_its_zombie_when_a_member_exited_unreaped():
    leader = start("import subprocess, sys\n"
                   "child = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
                   "print(child.pid, flush=True)\n"
                   "sys.stdin.read()\n")  # never waits for its child: the child stays a zombie
    try:
        child = int(leader.stdout.readline())
        deadline = time.monotonic() + 10
        while proc.stat(child).state != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(proc.group_members(leader.pid)) == sorted([leader.pid, child])
        assert proc.stat(child).state == "Z" and proc.stat(child).group == leader.pid
        assert proc.memory(child) is None and proc.command_line(child) == []
        assert os.getpid() not in proc.group_members(leader.pid)
    finally:
        finish(leader)
    assert proc.group_members(leader.pid) == []


def test_group_cpu_seconds_grows_when_a_member_computes():
    worker = start("import sys, time\nend = time.process_time() + 0.5\n"
                   "while time.process_time() < end: pass\nprint('done', flush=True)\nsys.stdin.read()\n")
    try:
        assert worker.stdout.readline().strip() == "done"
        assert 0.4 <= proc.group_cpu_seconds([worker.pid]) < 5
        assert proc.group_cpu_seconds([]) == 0.0
    finally:
        finish(worker)


def test_summed_pss_counts_a_shared_region_once_when_two_processes_map_it():
    region = Path("/dev/shm") / f"tritonpack-test-{uuid.uuid4().hex}"
    region.write_bytes(b"\0" * (64 << 20))
    try:
        children = [start(SHARE, str(region)) for _ in range(2)]
        try:
            assert [c.stdout.readline().strip() for c in children] == ["mapped", "mapped"]
            memories = [proc.memory(c.pid) for c in children]
            assert all(m.shmem >= 64 * MB and m.rss >= 64 * MB and m.shared >= 64 * MB for m in memories), memories
            # RSS charges the 64 MB to both; PSS half to each
            assert sum(m.rss for m in memories) - sum(m.pss for m in memories) >= 60 * MB
            assert proc.shm_resident_kb([region.name]) == 64 * MB
        finally:
            finish(*children)
    finally:
        region.unlink()


def test_memory_counts_private_pages_when_a_process_allocates():
    child = start("import sys\nblock = bytearray(48 << 20)\nprint('ok', flush=True)\nsys.stdin.read()\n")
    try:
        assert child.stdout.readline().strip() == "ok"
        m = proc.memory(child.pid)
        assert m.private >= 48 * MB and m.anonymous >= 48 * MB and m.pss >= 48 * MB and m.pss <= m.rss
        assert list(proc.memory_by_process([child.pid])) == [f"{Path(sys.executable).name}[{child.pid}]"]
    finally:
        finish(child)


@pytest.mark.parametrize("args, model, regions", [
    ([b"/x/backends/python/triton_python_backend_stub", b"/repo/bert_tokenizer/1/model.py",
      b"triton_python_backend_shm_region_7", b"1048576"], "bert_tokenizer", {"triton_python_backend_shm_region_7"}),
    ([b"/usr/bin/python3", b"/repo/bert_tokenizer/1/model.py"], None, set()),
    ([], None, set()),
])
def test_stub_model_reads_the_model_folder_when_given_a_stub_command_line(args, model, regions):
    assert proc.stub_model(args) == model
    assert proc.stub_model_file(args) == (Path("/repo/bert_tokenizer/1/model.py") if model else None)
    assert proc.stub_shm_regions(args) == regions
