"""Run the tritonserver bundled in the `nvidia-pytriton` wheel, without docker.

The wheel ships the server, the python backend and one stub per Python minor version; the stub must match
the Python the models run in, so a backend directory is prepared once per interpreter.
"""

from __future__ import annotations

import ctypes
import errno
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tritonpack import proc
from tritonpack.children import start_child
from tritonpack.errors import ServerError

if TYPE_CHECKING:
    from tritonpack.check import ServerPython
    from tritonpack.containers import ContainerPython

SOCKET_IN_USE = re.compile(r"Socket '[^']*:(\d+)' already in use")  # Triton's words for a port that is taken
LOG_ERROR = re.compile(r"E\d{4} [\d:.]+ +\d+ [^\]]*\] (.*)")  # glog's error lines, as tritonserver writes them
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"  # of the local python stub (this interpreter)


class PortInUse(ServerError):
    """tritonserver could not listen on `port`: another process holds it."""

    def __init__(self, message: str, port: int):
        super().__init__(message)
        self.port = port


def local_python_has(module: str) -> bool:
    """Whether the local stub's Python (this interpreter's environment) imports `module`."""
    return importlib.util.find_spec(module) is not None


def local_numpy_version() -> str | None:
    """numpy's version in the local stub's Python (this interpreter's environment), None without numpy."""
    import importlib.metadata

    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None


def local_server_python() -> ServerPython:
    """The Python the local Triton runs models without an environment in (this interpreter's), as `check` takes it."""
    from tritonpack.check import ServerPython

    return ServerPython(local_python_has, local_numpy_version(),
                        stub="--local: the local Triton's stub runs this interpreter")


def pytriton_root() -> Path:
    import pytriton

    return Path(pytriton.__file__).resolve().parent


def tritonserver_binary() -> Path:
    return pytriton_root() / "tritonserver" / "bin" / "tritonserver"


def server_library_path() -> str:
    root = pytriton_root()
    libs = [root.parent / "nvidia_pytriton.libs", root / "tritonserver" / "lib"]
    existing = os.environ.get("LD_LIBRARY_PATH", "")
    return os.pathsep.join([str(p) for p in libs if p.exists()] + ([existing] if existing else []))


def local_cache() -> Path:
    """Where the local Triton's prepared folders are kept."""
    return Path(os.environ.get("TRITONPACK_CACHE", Path.home() / ".cache" / "tritonpack"))


def prepare_backend_directory(cache: Path | None = None, python: str = PYTHON_VERSION) -> Path:
    """A backends/ folder whose python backend uses the stub for Python `python` (by default this interpreter's)."""
    cache = cache or local_cache()
    target = cache / f"backends-py{python}"
    stub = target / "python" / "triton_python_backend_stub"
    if stub.exists():
        return target
    source = pytriton_root() / "tritonserver"
    staging = Path(tempfile.mkdtemp(prefix="backends-", dir=cache.mkdir(parents=True, exist_ok=True) or cache))
    shutil.copytree(source / "backends", staging, dirs_exist_ok=True)
    shutil.copy2(source / "python_backend_stubs" / python / "triton_python_backend_stub",
                 staging / "python" / "triton_python_backend_stub")
    try:
        staging.rename(target)
    except OSError:  # another process prepared it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


LOCAL_BACKENDS = frozenset({"python", "ensemble"})  # what the bundled tritonserver runs
# The python backend starts each stub through `bash -c` with the model's path unquoted: these break it
SHELL_SPECIAL = frozenset(" \t\n'\"\\$`;&|<>()*?[]{}!")


def stub_path_problem(path: Path) -> str | None:
    """Why Triton's python backend could not start a stub for a model under `path`, or None."""
    special = sorted(set(str(Path(path).resolve())) & SHELL_SPECIAL)
    if not special:
        return None
    shown = " ".join(repr(c) for c in special)
    return (f"its path holds {shown}, which Triton's python backend passes unquoted to a shell when it starts a "
            f"model's stub (the stub fails and the model never loads): use a path without them")


def native_backends(repository: Path) -> tuple[list[str], bool]:
    """The backends (or platforms) of `repository` that the bundled tritonserver lacks, and whether any model asks
    for a GPU (`KIND_GPU`)."""
    from tritonpack.spec import mc, parse_config

    needed, gpu = set(), False
    for path in sorted(Path(repository).glob("*/config.pbtxt")):
        config = parse_config(path.read_text())
        needed.add(config.backend or config.platform)
        gpu |= any(group.kind == mc.ModelInstanceGroup.KIND_GPU for group in config.instance_group)
    return sorted(needed - LOCAL_BACKENDS), gpu


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int, taken: Iterable[int] = ()) -> list[int]:
    """`count` distinct free loopback ports, none of `taken`. Their sockets are held open together while chosen: one
    closed before the next is bound may be handed out again (a tritonserver got the same port for HTTP and metrics)."""
    taken, sockets, ports = set(taken), [], []
    try:
        while len(ports) < count:
            sockets.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sockets[-1].bind(("127.0.0.1", 0))
            if (port := sockets[-1].getsockname()[1]) not in taken:
                ports.append(port)
    finally:
        for s in sockets:
            s.close()
    return ports


def port_taken(port: int) -> bool:
    """Whether a socket listens on loopback `port`, where tritonserver could not listen. The probe binds as
    tritonserver does, with SO_REUSEADDR: a port a stopped server left in TIME_WAIT is free to it, and one any
    process listens on (tritonserver's own sockets included) is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def _become_subreaper() -> None:
    """Stubs orphaned when tritonserver exits are re-parented to this process instead of PID 1, which in a
    container may never reap them (they would stay zombies); `TritonServer.stop` reaps them."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


@dataclass(frozen=True)
class ServerMemory:
    """PSS in kB (`proc`): of tritonserver with every process it started, of tritonserver alone, and of the python
    stubs by the model.py each runs."""

    total: int
    tritonserver: int
    stubs: dict[Path, int]


@dataclass
class TritonServer:
    """A tritonserver process serving `model_repository`; use as a context manager.

    `extra_args` pass straight to tritonserver (e.g. the SageMaker front-end flags). Without `log_path` the log goes
    to a new temporary folder, removed by a clean `stop()` unless `keep_log` (the CLI prints where it is).
    """

    model_repository: Path | None
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 180.0
    keep_log: bool = False
    taken_ports: tuple[int, ...] = ()  # ports the extra_args make it listen on: not chosen for the others
    # the stub of the container's Python instead of this interpreter's (`containers.ContainerPython`)
    container_python: ContainerPython | None = None
    process: subprocess.Popen | None = None
    _stubs: dict[int, Path] = field(default_factory=dict, repr=False)  # pid → the model.py it runs
    _regions: set[str] = field(default_factory=set, repr=False)
    _owns_log_dir: bool = field(default=False, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        chosen = iter(free_ports(3, taken=(self.http_port, self.grpc_port, self.metrics_port, *self.taken_ports)))
        self.http_port = self.http_port or next(chosen)
        self.grpc_port = self.grpc_port or next(chosen)
        self.metrics_port = self.metrics_port or next(chosen)
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="tritonpack-")) / "tritonserver.log"
            self._owns_log_dir = True

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        python = self.container_python
        cmd = [
            *(python.launcher(local_cache()) if python else []),
            str(tritonserver_binary()),
            f"--backend-directory={prepare_backend_directory(python=python.version if python else PYTHON_VERSION)}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            # loopback, as `url` says: Triton's default is every interface (its SageMaker port has no such flag)
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            "--allow-metrics=true",
            "--log-verbose=0",
        ]
        if self.model_repository is not None:
            cmd.append(f"--model-repository={Path(self.model_repository).resolve()}")
        return cmd + list(self.extra_args)

    def start(self, wait_ready: bool = True) -> TritonServer:
        """Start tritonserver and (by default) wait until it is ready. Interrupted (Ctrl-C) or failing at any point,
        it stops what it started, log kept, before raising."""
        try:
            self._launch()
        except BaseException:
            self._abandon()
            raise
        if wait_ready:
            self.wait_ready()
        return self

    def _launch(self) -> None:
        from tritonpack.containers import container_site_environment, takes_container_numpy
        from tritonpack.envpack import stock_site_packages

        _become_subreaper()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = server_library_path()
        if self.container_python is not None:  # the stub runs the packed environments' Python, else the stock one
            env["LD_LIBRARY_PATH"] += f"{os.pathsep}{self.container_python.library_dir}"
            env["PATH"] = f"{self.container_python.stock_bin(local_cache())}{os.pathsep}{env.get('PATH', '')}"
            env.update(container_site_environment(self.container_python.stock_site_packages(local_cache()),
                                                  env.get("PYTHONPATH")))
        else:  # the stub runs in this interpreter's environment: make its site-packages and bin visible
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            if takes_container_numpy(PYTHON_VERSION):  # environments packed for this Python leave numpy out
                env.update(container_site_environment(stock_site_packages(PYTHON_VERSION), env.get("PYTHONPATH")))
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            start_child(self.command(), started=self._hold, stdout=log, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True)

    def _hold(self, process: subprocess.Popen) -> None:
        self.process = process

    def _get(self, path: str, timeout: float = 2.0) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return 0

    def is_ready(self) -> bool:
        """Triton's HTTP readiness, answered by this server: its process alive and listening on each of its ports.
        Another tritonserver on the same HTTP port answered ready while this one was failing to listen there."""
        return self._get("/v2/health/ready") == 200 and self.listens_on(self.http_port, self.grpc_port,
                                                                          self.metrics_port)

    def listens_on(self, *ports: int) -> bool:
        """Whether this server's own process holds a listening socket on each of `ports`."""
        if self.process is None or self.process.poll() is not None:
            return False
        held = proc.socket_inodes(self.process.pid)
        return all(any(listener.inode in held for listener in proc.listeners(port, self.process.pid))
                   for port in ports)

    def is_live(self) -> bool:
        return self._get("/v2/health/live") == 200

    def wait_ready(self, timeout_s: float | None = None, probe: Callable[[], bool] | None = None) -> None:
        """Wait until `probe` (default: Triton's HTTP readiness) answers True. A server that exits first, does not get
        there in time, or whose wait is interrupted (Ctrl-C while models load) is stopped, its log kept; the first two
        raise ServerError naming that log."""
        probe = probe or self.is_ready
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise self._early_exit_error()
                if probe():
                    self.stub_models()
                    return
                time.sleep(0.2)
            raise ServerError(f"tritonserver not ready after {timeout_s or self.startup_timeout_s:.0f}s; "
                              f"log: {self.log_path}\n{self.log_tail()}")
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Stop what was started, keeping the log an error names."""
        self.keep_log = True
        self.stop()

    def _early_exit_error(self) -> ServerError:
        """Why tritonserver exited before it was ready: one line when its log says (a port another process holds is
        a PortInUse), else the log's tail."""
        said = f"tritonserver exited with {self.process.returncode} before it was ready"
        error = self.last_error()
        if not error:
            return ServerError(f"{said}; log: {self.log_path}\n{self.log_tail()}")
        if taken := SOCKET_IN_USE.search(error):
            return PortInUse(f"{said}: {error}; log: {self.log_path}", int(taken.group(1)))
        return ServerError(f"{said}: {error}; log: {self.log_path}")

    def last_error(self) -> str:
        """The message of the last error line in the log (`E1126 15:33:19.39 6979 main.cc:270] "…"`) up to its
        first escaped newline (a Python traceback follows there), or ''."""
        for line in reversed(self._log_lines()):
            match = LOG_ERROR.match(line)
            if match:
                return match.group(1).split("\\n")[0].strip().strip('"').strip()
        return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self._log_lines()[-lines:])

    def _log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def process_group_pids(self) -> list[int]:
        """The server and every process it started (python stubs share its process group), zombies included."""
        return proc.group_members(self.process.pid) if self.process is not None else []

    def memory(self) -> ServerMemory | None:
        """PSS of tritonserver and its live stubs now; None when it is not running."""
        if self.process is None or (server := proc.memory(self.process.pid)) is None:
            return None
        stubs, total = {}, server.pss
        for pid in self.process_group_pids():
            if pid != self.process.pid and (m := proc.memory(pid)) is not None:
                total += m.pss
                if (model_file := proc.stub_model_file(proc.command_line(pid))) is not None:
                    stubs[model_file] = stubs.get(model_file, 0) + m.pss
        return ServerMemory(total, server.pss, stubs)

    def stub_shm_regions(self) -> set[str]:
        """The /dev/shm regions of this server's python stubs seen so far (each stub's command line names one)."""
        self.stub_models()
        return set(self._regions)

    def stub_models(self) -> dict[int, str]:
        """pid → model folder of each python stub seen so far (remembered: a dead stub's cmdline is empty).

        Also notes the /dev/shm regions tritonserver maps: a stub that died before anyone looked at it is known
        by its region there (Triton 2.51 leaves it behind when its exit times out)."""
        if self.process is not None:
            self._regions |= proc.mapped_shm_regions(self.process.pid)
        for pid in self.process_group_pids():
            args = proc.command_line(pid)
            if (model_file := proc.stub_model_file(args)) is not None:
                self._stubs[pid] = model_file
                self._regions.update(proc.stub_shm_regions(args))
        return {pid: model_file.parent.parent.name for pid, model_file in self._stubs.items()}

    def dead_stubs(self) -> list[str]:
        """Models whose python stub has died (now a zombie of tritonserver). Triton 2.51 keeps answering ready
        for such a model while every request to it fails with 500 "Stub process ... is not healthy"."""
        known = self.stub_models()
        return sorted(known.get(pid, str(pid)) for pid in self._dead_pids())

    def dead_stub_files(self) -> list[Path]:
        """The model.py files of the python stubs that have died (as `dead_stubs`)."""
        self.stub_models()
        return sorted(self._stubs[pid] for pid in self._dead_pids() if pid in self._stubs)

    def _dead_pids(self) -> list[int]:
        return [pid for pid in self.process_group_pids() if (s := proc.stat(pid)) and s.exited]

    def _reap(self) -> None:
        """Collect exited stubs re-parented to us (see `_become_subreaper`); others' children are left alone."""
        for pid in self.process_group_pids():
            with suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM lets Triton unload models and stop its stubs; anything left after the timeout is killed.

        Triton gives up unloading when its exit timeout passes (an idle keep-alive client connection holds it
        that long) and then leaves its stubs' /dev/shm regions behind: those are removed here once the stubs
        are gone, and the stubs are reaped, so nothing of the server outlives stop(). The log folder this object
        made goes too, unless it is to be kept or something failed (the server did not get ready, exited on its own
        or with an error, or a stub died): then the log stays where the error named it.

        Once stopped, a second call does nothing: the server's process group id may be another's by then.
        """
        if self.process is None or self._stopped:
            return
        pgid = self.process.pid
        regions = self.stub_shm_regions()
        self.keep_log |= self.process.poll() is not None or bool(self.dead_stubs())
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        deadline = time.monotonic() + 5
        # stubs finish exiting after a server that exited; one still running past the timeout is killed at once
        while self.process.poll() is not None and self.process_group_pids() and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.1)
        with suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=5)
        deadline = time.monotonic() + 5
        while self.process_group_pids() and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for region in regions:
            with suppress(OSError):
                (proc.SHM / region).unlink()
        if self._owns_log_dir and not self.keep_log and self.process.returncode == 0:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)
        self._stopped = True

    def __enter__(self) -> TritonServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
