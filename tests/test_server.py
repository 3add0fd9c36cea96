"""The bundled tritonserver: starts on free ports, says where its log is, leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mme_support import kill_and_reap, python_model_repository
from tritonpack import proc
from tritonpack.server import PYTHON_VERSION, ServerError, TritonServer, prepare_backend_directory

pytestmark = pytest.mark.server


def test_backend_directory_has_stub_for_running_python_when_prepared():
    backends = prepare_backend_directory()
    assert (backends / "python" / "libtriton_python.so").exists()
    assert (backends / "python" / "triton_python_backend_stub").exists()
    assert backends.name == f"backends-py{PYTHON_VERSION}"


def test_server_leaves_no_process_when_stopped_after_serving(build_ensemble):
    server = TritonServer(build_ensemble("bert", "portable").repository).start()
    try:
        group = server.process_group_pids()
        assert len(group) >= 2, "expected tritonserver plus a stub per python model instance (bert: its encoder)"
        assert server.log_path.exists()
    finally:
        server.stop()
    assert server.process_group_pids() == []
    assert not server.is_live()
    assert not server.log_path.parent.exists(), "the log folder of a clean run outlived stop()"


def listening_addresses(port: int) -> set[str]:
    """The local addresses sockets listen on at `port`."""
    return {listener.address for listener in proc.listeners(port)}


def test_server_listens_on_loopback_only_when_started(tmp_path):
    (tmp_path / "empty").mkdir()
    with TritonServer(tmp_path / "empty") as server:
        for port in (server.http_port, server.grpc_port, server.metrics_port):
            assert listening_addresses(port) == {"127.0.0.1"}, port  # Triton's default was 0.0.0.0


def test_server_keeps_a_log_path_it_was_given_when_stopped(tmp_path):
    log, repository = tmp_path / "logs" / "tritonserver.log", tmp_path / "empty"
    repository.mkdir()
    server = TritonServer(repository, log_path=log).start()
    server.stop()
    assert server.process.returncode == 0
    assert "Started HTTPService" in log.read_text()


def test_server_raises_one_line_naming_its_log_when_repository_is_broken(tmp_path):
    model = tmp_path / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nmax_batch_size: 0\n')
    (model / "1" / "model.py").write_text("raise RuntimeError('cannot load me')\n")
    server = TritonServer(tmp_path, startup_timeout_s=60)
    with pytest.raises(ServerError, match="before it was ready|not ready") as error:
        server.start()
    assert str(server.log_path) in str(error.value)
    # one line saying why, in Triton's words, without the traceback that follows them in the log nor its tail
    said = str(error.value)
    assert "\n" not in said and said.endswith("before it was ready: failed to load 'broken' version 1: Internal: "
                                              f"RuntimeError: cannot load me; log: {server.log_path}")
    assert server.process_group_pids() == []  # start() stopped what it started: no stop() needed
    assert "cannot load me" in server.log_path.read_text(), "the log the error names is gone"


def test_serve_smoke_prints_a_real_embedding_when_run_from_the_cli(build_ensemble):
    repository = build_ensemble("bert", "portable").repository
    result = subprocess.run([sys.executable, "-m", "tritonpack.cli", "serve", str(repository), "--smoke"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "log: " in result.stdout and "EMBEDDING (384,)" in result.stdout
    # a clean run's log folder goes (each `make ensemble` left one in /tmp); `serve` until stopped keeps it
    assert not Path(result.stdout.split("log: ")[1].split()[0]).parent.exists()


def test_serve_smoke_keeps_the_log_and_names_it_in_one_line_when_the_request_fails(tmp_path, capsys):
    from tritonpack.cli import main

    repository = python_model_repository(tmp_path / "repo", "m", per_request="raise RuntimeError('no answer')")
    assert main(["serve", str(repository), "--smoke"]) == 1
    out, err = capsys.readouterr()
    log = Path(out.split("log: ")[1].split()[0])
    assert err.splitlines() == [f"error: the smoke request failed: in ensemble 'm', Failed to process the request(s) "
                                f"for model 'm_step_0_0', message: RuntimeError: no answer; log: {log}"]
    assert "no answer" in log.read_text()
    assert serving(repository) == []
    shutil.rmtree(log.parent)


def serving(repository: Path) -> list[int]:
    """Processes whose command line names `repository` (a tritonserver serving it)."""
    needle = f"--model-repository={repository.resolve()}".encode()
    return [pid for pid in proc.pids() if needle in proc.command_line(pid)]


def serve_command(repository: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tritonpack.cli", "serve", str(repository)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_serving(command: subprocess.Popen, repository: Path, timeout_s: float = 60) -> None:
    """Wait until a tritonserver serves `repository`; fail with what `command` said if it ends first."""
    deadline = time.monotonic() + timeout_s
    while not serving(repository) and command.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if command.poll() is not None:
        pytest.fail(f"serve exited with {command.returncode} before tritonserver started: "
                    f"{command.stdout.read()}{command.stderr.read()}")
    assert serving(repository), f"no tritonserver after {timeout_s:.0f} s"


def ready_tritonserver(command: subprocess.Popen, repository: Path) -> int:
    """The pid of the tritonserver `serve_command` started, once it says "ready"."""
    assert "starting tritonserver" in command.stdout.readline()
    assert command.stdout.readline().strip() == "ready"
    (server,) = [pid for pid in serving(repository) if proc.process_name(pid) == "tritonserver"]
    return server


def test_serve_stops_tritonserver_when_its_terminal_closes_while_models_load(tmp_path):
    """SIGHUP's default ended Python at once, and tritonserver, in a session of its own, served on."""
    repository = python_model_repository(tmp_path / "repo", "m", at_import="time.sleep(60)")
    with serve_command(repository) as command:
        assert "starting tritonserver" in command.stdout.readline()
        wait_until_serving(command, repository)
        time.sleep(1)  # loading the model (it sleeps when imported)
        command.send_signal(signal.SIGHUP)
        assert command.wait(timeout=60) == 130
        assert "interrupted before tritonserver was ready; stopped" in command.stderr.read()
    assert serving(repository) == []


def test_serve_exits_with_an_error_naming_the_log_when_tritonserver_dies(tmp_path):
    repository = python_model_repository(tmp_path / "repo", "m")
    with serve_command(repository) as command:
        os.kill(ready_tritonserver(command, repository), signal.SIGKILL)
        assert command.wait(timeout=60) == 1  # was 0: "stopping", as if asked to
        assert re.search(r"error: tritonserver exited with -9; log: \S+tritonserver.log", command.stderr.read())
    assert serving(repository) == []


def test_serve_killed_with_sigkill_leaves_no_tritonserver_behind(tmp_path):
    """tritonserver runs in a session of its own: killed, serve left it serving on (its ports, memory, stubs)."""
    repository = python_model_repository(tmp_path / "repo", "m")
    with serve_command(repository) as command:
        group = proc.group_members(ready_tritonserver(command, repository))
        command.kill()
    deadline = time.monotonic() + 60
    while serving(repository) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = serving(repository)
    kill_and_reap(left, group)
    assert left == []


def test_server_start_leaves_no_process_or_shm_region_when_interrupted_before_its_wait_for_readiness(tmp_path,
                                                                                                     monkeypatch):
    """Ctrl-C after tritonserver was forked but before start() waited for it (a slow exec on a loaded machine) lost
    the process: it served on with its stubs and their /dev/shm regions, after `serve` had said "stopped"."""
    from tritonpack import server as server_module

    repository = python_model_repository(tmp_path / "repo", "m")
    start_child, seen = server_module.start_child, {}

    def interrupted_once_a_stub_runs(*args, **kwargs):
        process = start_child(*args, **kwargs)
        deadline = time.monotonic() + 60
        while not seen.get("regions") and time.monotonic() < deadline:
            seen["regions"] = proc.mapped_shm_regions(process.pid)
            time.sleep(0.05)
        seen["group"] = proc.group_members(process.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(server_module, "start_child", interrupted_once_a_stub_runs)
    server = TritonServer(repository)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    shutil.rmtree(server.log_path.parent)
    left = [pid for pid in seen["group"] if (found := proc.stat(pid)) and not found.exited]
    regions_left = {region for region in seen["regions"] if (proc.SHM / region).exists()}
    kill_and_reap(left, seen["group"])
    for region in regions_left:
        (proc.SHM / region).unlink()
    assert seen["regions"] and len(seen["group"]) >= 2, "no stub started"
    assert left == [] and regions_left == set()


def test_server_says_in_one_line_which_port_is_taken_when_another_process_holds_it(tmp_path):
    """A taken --http-port ended in Triton's error followed by 30 lines of its log."""
    from tritonpack.server import PortInUse

    repository = python_model_repository(tmp_path / "repo", "m")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = TritonServer(repository, http_port=port, startup_timeout_s=60)
        with pytest.raises(PortInUse) as error:
            server.start()
    assert error.value.port == port
    assert str(error.value) == (f"tritonserver exited with 1 before it was ready: failed to start HTTP service: "
                                f"Unavailable - Socket '127.0.0.1:{port}' already in use; log: {server.log_path}")
    assert server.process_group_pids() == []
    shutil.rmtree(server.log_path.parent)


@contextlib.contextmanager
def listening_socket():
    """The port of a plain socket listening on loopback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_server_is_not_ready_when_another_tritonserver_answers_on_its_port(tmp_path):
    """The other server's readiness on the HTTP port was taken for this one's: start() returned, and this one exited
    with 1 ("already in use") a moment later."""
    from tritonpack.server import PortInUse

    repository = python_model_repository(tmp_path / "repo", "m")
    (tmp_path / "empty").mkdir()
    with TritonServer(tmp_path / "empty") as other:
        for option in ("http_port", "metrics_port"):
            server = TritonServer(repository, **{option: getattr(other, option)}, startup_timeout_s=60)
            with pytest.raises(PortInUse) as error:
                server.start()
            assert error.value.port == getattr(other, option)
            assert server.process_group_pids() == []
            shutil.rmtree(server.log_path.parent)


def test_serve_says_in_one_line_which_port_is_taken_when_a_socket_or_another_tritonserver_holds_it(tmp_path,
                                                                                                     capsys):
    """A second `serve` on the first one's --http-port said "ready" (the first one answered), then "error:
    tritonserver exited with 1", naming no port; a plain socket got the one line."""
    from tritonpack.cli import main

    repository = python_model_repository(tmp_path / "repo", "m")
    (tmp_path / "empty").mkdir()
    with TritonServer(tmp_path / "empty") as other, listening_socket() as plain:
        taken = [("--http-port", plain), ("--http-port", other.http_port), ("--grpc-port", other.grpc_port),
                 ("--metrics-port", other.metrics_port)]
        for option, port in taken:
            assert main(["serve", str(repository), option, str(port)]) == 2
            out, err = capsys.readouterr()
            assert out == ""  # neither "starting" nor "ready": no tritonserver started
            assert err.splitlines() == [f"error: {option} {port} is taken by another process: choose another "
                                        f"{option}, or 0 for a free one"]
    assert serving(repository) == []


@pytest.mark.parametrize("holder", ["socket", "tritonserver"])
def test_serve_names_the_fix_in_one_line_when_the_http_port_is_taken_after_its_check(holder, tmp_path, capsys,
                                                                                       monkeypatch):
    """Taken between the check and tritonserver's start: Triton's error and 30 lines of its log, no word of what to
    do; or, taken by a tritonserver, a false "ready" before "tritonserver exited with 1"."""
    from tritonpack import server as server_module
    from tritonpack.cli import main

    monkeypatch.setattr(server_module, "port_taken", lambda port: False)
    repository = python_model_repository(tmp_path / "repo", "m")
    (tmp_path / "empty").mkdir()
    with contextlib.ExitStack() as holding:
        if holder == "socket":
            port = holding.enter_context(listening_socket())
        else:
            port = holding.enter_context(TritonServer(tmp_path / "empty")).http_port
        assert main(["serve", str(repository), "--http-port", str(port)]) == 2
    out, err = capsys.readouterr()
    log = out.split("log: ")[1].split()[0]
    assert "ready" not in out.splitlines()
    assert err.splitlines() == [f"error: --http-port {port} is taken by another process: choose another --http-port, "
                                f"or 0 for a free one; log: {log}"]
    assert "already in use" in Path(log).read_text()
    assert serving(repository) == []
    shutil.rmtree(Path(log).parent)
