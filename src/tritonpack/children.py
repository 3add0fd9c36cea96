"""Child processes that end when this process ends, however it ends.

tritonserver and the bench's peers run in sessions of their own, so that stopping one signals its whole process
group; but then nothing stops them when this process is killed (SIGKILL, the out-of-memory killer): they would go on
holding their ports, memory and /dev/shm regions. Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) sends them
SIGTERM instead. It is set in the child before the program starts, by a few lines of Python that then exec it: set
through `preexec_fn` it would run code in a child forked from a threaded process. The signal goes when the *thread*
that forked the child ends, not the process, so every child is forked by one daemon thread of this module, which
ends only with the process (a ThreadPoolExecutor's worker ends when the main thread returns, before `atexit`); the
children of that child (python stubs) do not inherit the setting.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from functools import partial

_LAUNCHER = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
if not os.path.exists(f"/proc/{sys.argv[2]}/task/{sys.argv[3]}"):  # the forking thread ended before the line above
    sys.exit(1)
for ignored in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; the program gets them as Popen leaves them
    signal.signal(ignored, signal.SIG_DFL)
errors = int(sys.argv[1])
os.set_inheritable(errors, False)  # closed by a successful exec: the parent reads end-of-file
try:
    os.execvp(sys.argv[4], sys.argv[4:])
except OSError as e:
    os.write(errors, str(e.errno).encode())
    os._exit(127)
"""

_lock = threading.Lock()
_forker: tuple[threading.Thread, queue.SimpleQueue] | None = None


def start_child(command: list[str], started: Callable[[subprocess.Popen], None] | None = None,
                **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(command, **popen_kwargs)`, whose process gets SIGTERM when this process dies. Like Popen, it
    raises OSError (FileNotFoundError, PermissionError …) when `command[0]` cannot be executed.

    Interrupted (Ctrl-C) before it returns, it kills the child it forked meanwhile (its process group, if it leads
    one). `started` gets the process as soon as it is forked: a caller interrupted just after this returns holds it."""
    thread, jobs = _forking_thread()
    read_end, write_end = os.pipe()
    launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(write_end), str(os.getpid()), str(thread.native_id),
                *command]
    future: Future = Future()
    future.add_done_callback(lambda _: os.close(write_end))  # once forked: the child holds its own copy
    try:
        jobs.put((future, launcher, {**popen_kwargs, "pass_fds": (*popen_kwargs.get("pass_fds", ()), write_end)}))
        process = future.result()
        if started is not None:
            started(process)
        failed = _exec_error(read_end)
    except BaseException:
        future.add_done_callback(partial(_kill_forked, own_group=bool(popen_kwargs.get("start_new_session"))))
        raise
    finally:
        os.close(read_end)
    if failed:
        process.wait()
        raise OSError(failed, os.strerror(failed), command[0])
    return process


def _exec_error(read_end: int) -> int:
    """The errno the launcher writes when it cannot exec the program; 0 when the exec closed the pipe."""
    with os.fdopen(read_end, "rb", closefd=False) as errors:
        failed = errors.read()
    return int(failed) if failed else 0


def _kill_forked(future: Future, own_group: bool) -> None:
    """SIGKILL and reap the child `future` forked, if it forked one."""
    if future.exception() is not None:
        return
    process = future.result()
    with suppress(ProcessLookupError):
        if own_group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    process.wait()


def _forking_thread() -> tuple[threading.Thread, queue.SimpleQueue]:
    """The thread that forks every child, started on first use (and again in a forked copy of this process)."""
    global _forker
    with _lock:
        if _forker is None or not _forker[0].is_alive():
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            thread = threading.Thread(target=_fork_jobs, args=(jobs,), name="child-forker", daemon=True)
            thread.start()
            _forker = (thread, jobs)
        return _forker


def _fork_jobs(jobs: queue.SimpleQueue) -> None:
    while True:
        future, command, popen_kwargs = jobs.get()
        try:
            future.set_result(subprocess.Popen(command, **popen_kwargs))
        except BaseException as e:  # noqa: BLE001 - the caller's error, raised in its thread
            future.set_exception(e)
