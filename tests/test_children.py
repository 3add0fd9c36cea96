"""Children started with `start_child` end when the process that started them is killed, whichever thread forked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mme_support import kill_and_reap
from tritonpack import proc
from tritonpack.children import start_child

PARENT = """
import sys, threading, time
from tritonpack.children import start_child

started = []


def start_and_end():  # were this the thread that forked, the parent-death signal would come when it ends
    started.append(start_child(["sleep", "300"], start_new_session=True))
    time.sleep(0.5)  # ends after the child has set its signal


thread = threading.Thread(target=start_and_end)
thread.start()
thread.join()
print(started[0].pid, flush=True)
time.sleep(300)
"""


def running(pid: int) -> bool:
    found = proc.stat(pid)
    return found is not None and not found.exited


def test_child_outlives_the_thread_that_started_it_and_gets_sigterm_when_its_parent_is_killed():
    src = str(Path(__file__).resolve().parents[1] / "src")
    with subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=src)) as parent:
        try:
            child = int(parent.stdout.readline())
            time.sleep(1)
            assert running(child), "the child died with the thread that started it"
            assert proc.command_line(child) == [b"sleep", b"300"]  # the launcher exec'd the program in place
        finally:
            parent.kill()
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = running(child)
    kill_and_reap([child] if alive else [], [child])
    assert not alive, "the child outlived its killed parent"


def test_a_program_that_cannot_start_raises_as_popen_does_and_one_that_starts_gets_default_signals():
    with pytest.raises(FileNotFoundError, match="/nonexistent/program"):
        start_child(["/nonexistent/program"])
    with pytest.raises(PermissionError):
        start_child([__file__])  # not executable
    def ignored_signals(status: str) -> str:
        return next(line for line in status.splitlines() if line.startswith("SigIgn:"))

    command = ["cat", "/proc/self/status"]
    expected = ignored_signals(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    # Python ignores SIGPIPE and SIGXFSZ, and exec kept that; Popen restores them (what the shell ignored stays)
    assert ignored_signals(start_child(command, stdout=subprocess.PIPE, text=True).communicate()[0]) == expected


def test_start_child_ends_the_child_it_forked_when_interrupted_before_returning_it():
    """Ctrl-C while start_child waited for the fork or the exec lost the child: a tritonserver then ran on, its
    stubs and /dev/shm regions with it, after `serve` had said "stopped". The interrupt is raised where a signal's
    would be, after the fork and before start_child returns (a real SIGINT here would also reach the suite)."""
    forked = []

    def interrupted(process):
        forked.append(process)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_child(["sleep", "300"], started=interrupted, start_new_session=True)
    try:
        assert forked[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        kill_and_reap([forked[0].pid] if forked[0].poll() is None else [], [])
