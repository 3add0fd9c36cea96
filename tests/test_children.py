"""Children started with `start_child` end when the process that started them is killed, whichever thread forked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from tritonpack import proc

PARENT = """
import sys, threading, time
from tritonpack.children import start_child

started = []


def start_and_end():  # the parent-death signal follows the thread that forked: it must not be this one
    started.append(start_child(["sleep", "300"], start_new_session=True))
    time.sleep(0.5)  # the child has set its signal by now


thread = threading.Thread(target=start_and_end)
thread.start()
thread.join()
print(started[0].pid, flush=True)
time.sleep(300)
"""


def running(pid: int) -> bool:
    found = proc.stat(pid)
    return found is not None and found.state not in ("Z", "X")


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
    with suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    with suppress(ChildProcessError):  # re-parented to this process when a test before made it a subreaper
        os.waitpid(child, 0)
    assert not alive, "the child outlived its killed parent"
