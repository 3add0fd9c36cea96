"""The bundled tritonserver: starts on free ports, says where its log is, leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
        assert len(group) >= 3, "expected tritonserver plus a stub per python model instance"
        assert server.log_path.exists()
    finally:
        server.stop()
    assert server.process_group_pids() == []
    assert not server.is_live()
    assert not server.log_path.parent.exists(), "the log folder of a clean run outlived stop()"


def test_server_keeps_a_log_path_it_was_given_when_stopped(tmp_path):
    log, repository = tmp_path / "logs" / "tritonserver.log", tmp_path / "empty"
    repository.mkdir()
    server = TritonServer(repository, log_path=log).start()
    server.stop()
    assert server.process.returncode == 0
    assert "Started HTTPService" in log.read_text()


def test_server_raises_with_log_tail_when_repository_is_broken(tmp_path):
    model = tmp_path / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nmax_batch_size: 0\n')
    (model / "1" / "model.py").write_text("raise RuntimeError('cannot load me')\n")
    server = TritonServer(tmp_path, startup_timeout_s=60)
    with pytest.raises(ServerError, match="before it was ready|not ready") as error:
        server.start()
    assert str(server.log_path) in str(error.value)
    server.stop()
    assert server.process_group_pids() == []
    assert "cannot load me" in server.log_path.read_text(), "the log the error names is gone"


def test_serve_smoke_prints_a_real_embedding_when_run_from_the_cli(build_ensemble):
    repository = build_ensemble("bert", "portable").repository
    result = subprocess.run([sys.executable, "-m", "tritonpack.cli", "serve", str(repository), "--smoke"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "log: " in result.stdout and "EMBEDDING (384,)" in result.stdout
    assert Path(result.stdout.split("log: ")[1].split()[0]).exists()
