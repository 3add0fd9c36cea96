"""Child processes that end when this process ends, however it ends.

tritonserver and the bench's peers run in sessions of their own, so that stopping one signals its whole process
group; but then nothing stops them when this process is killed (SIGKILL, the out-of-memory killer): they would go on
holding their ports, memory and /dev/shm regions. Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) sends them
SIGTERM instead. It is set in the child before the program starts, by a few lines of Python that then exec it: set
through `preexec_fn` it would run code in a child forked from a threaded process. The signal goes when the *thread*
that forked the child ends, not the process, so every child is forked by one thread that lives as long as this
process; the children of that child (python stubs) do not inherit the setting.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

_EXEC_WITH_PARENT_DEATH_SIGNAL = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the parent died before the signal was set
    sys.exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.exit(f"cannot start {sys.argv[2]}: {e.strerror}")
"""

_forker = ThreadPoolExecutor(1, thread_name_prefix="child-forker")


def start_child(command: list[str], **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(command, **popen_kwargs)`, whose process gets SIGTERM when this process dies."""
    launcher = [sys.executable, "-I", "-S", "-c", _EXEC_WITH_PARENT_DEATH_SIGNAL, str(os.getpid()), *command]
    return _forker.submit(subprocess.Popen, launcher, **popen_kwargs).result()
