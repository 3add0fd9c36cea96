"""The local MME under attack and faults, against the real gateway and tritonserver (issue: "a real HTTP server, an
enforced model limit, failures that stay contained").

The targets are tiny python-backend ensembles (tests/mme_support.py `python_model_tarball`) that load in about a
second: healthy ones, one whose `execute` kills its stub, one that kills tritonserver, one that raises at import,
an empty tarball and a sparse 2 GiB file. One LocalMME serves the module; the tests that kill tritonserver or stop
the gateway get their own.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from tests import mme_support
from tests.mme_support import (
    SERVER_KILLER,
    STUB_KILLER,
    metrics,
    python_model_tarball,
    raw_invoke,
    runtime_for,
    text_body,
    timing,
)
from tests.reliability import hostile
from tritonpack.containers import DEFAULT_CONTAINER, container_python
from tritonpack.mme import LocalMME
from tritonpack.mme.container import TARGET_HEADER
from tritonpack.mme.health import FaultPolicy
from tritonpack.proc import command_line, group_members, mapped_files, pids, stub_model_file

pytestmark = pytest.mark.server
aws_env, local_mme = mme_support.aws_env, mme_support.local_mme
HEALTHY = ("a.tar.gz", "b.tar.gz", "c.tar.gz", "d.tar.gz")
UTF8_TARGET = "modèle-東京.tar.gz"
POLICY = FaultPolicy(crashes_to_quarantine=2)  # two crashes are enough to show the quarantine


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mme-fault-models")
    for target in HEALTHY:
        python_model_tarball(folder / target, f"ok_{target[0]}")
    python_model_tarball(folder / UTF8_TARGET, "ok_utf8")
    python_model_tarball(folder / "slow.tar.gz", "slow", per_request="time.sleep(0.5)")
    python_model_tarball(folder / "stub-killer.tar.gz", "stub_killer", per_request=STUB_KILLER)
    python_model_tarball(folder / "server-killer.tar.gz", "server_killer", per_request=SERVER_KILLER)
    python_model_tarball(folder / "import-error.tar.gz", "import_error",
                         at_import="raise RuntimeError('broken at import on purpose')")
    import tarfile

    tarfile.open(folder / "empty.tar.gz", "w:gz").close()
    with tarfile.open(folder / "native.tar.gz", "w:gz") as tar:  # a backend the local Triton lacks, as in `cpu` builds
        for name, data in (("enc/config.pbtxt", b'name: "enc"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'),
                           ("enc/1/model.onnx", b"never read")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    with open(folder / "sparse.tar.gz", "wb") as f:
        f.truncate(2 << 30)  # 2 GiB of holes: no disk blocks
    return folder


@pytest.fixture(scope="module")
def mme(models_dir, local_mme) -> LocalMME:
    return local_mme(models_dir, max_models=2, policy=POLICY)


def invoke(server: LocalMME, target: str, session=None):
    return raw_invoke(server, target, text_body(), session=session)


def triton_loaded(server: LocalMME) -> set[str]:
    """The model hashes Triton's own SageMaker front-end lists as loaded."""
    listed = json.loads(server.triton.request("GET", "/models", timeout=10).body)["models"]
    return {m["modelName"] for m in listed if m}


def zombie_children() -> list[int]:
    """Processes of this test run that have exited and were never collected."""
    zombies = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, ppid = entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[:2]
            except OSError:
                continue
            if int(ppid) == os.getpid() and state == "Z":
                zombies.append(int(entry.name))
    return zombies


# ---- 1. the loaded-model limit --------------------------------------------------------------------------------
def test_local_mme_keeps_at_most_max_models_in_triton_when_first_calls_to_four_targets_are_concurrent(mme):
    seen, done = [], threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append((len(mme.manager.slots.snapshot()), len(triton_loaded(mme))))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda t: invoke(mme, t), HEALTHY * 2))
    finally:
        done.set()
        watcher.join()
    assert [a.status_code for a in answers] == [200] * 8, [a.text[:200] for a in answers]
    assert len(seen) > 10 and max(slots for slots, _ in seen) <= 2 and max(listed for _, listed in seen) <= 2
    assert len(triton_loaded(mme)) <= 2 and metrics(mme)["LoadedModelCount"] <= 2


# ---- 2. a failed load evicts nothing ---------------------------------------------------------------------------
@pytest.mark.parametrize("target, reason", [
    ("import-error.tar.gz", "broken at import on purpose"), ("empty.tar.gz", "no model folder"),
    ("native.tar.gz", "unable to find backend library for backend 'onnxruntime', try specifying runtime on the model "
                      "configuration.; the local Triton has only the python backend: a `portable` build "
                      "(TARGET=portable) serves here")])
def test_local_mme_leaves_loaded_models_as_they_were_when_a_load_fails(mme, target, reason):
    for healthy in HEALTHY[:2]:
        assert invoke(mme, healthy).status_code == 200
    loaded, in_triton, before = set(mme.manager.loaded_targets()), triton_loaded(mme), metrics(mme)
    assert len(loaded) == 2
    for _ in range(2):  # the second call is answered from memory: no eviction, no load
        answer = invoke(mme, target)
        assert answer.status_code == 400 and answer.json()["ErrorCode"] == "ValidationError", answer.text
        assert reason in answer.json()["message"] and target in answer.json()["message"]
        assert set(mme.manager.loaded_targets()) == loaded and triton_loaded(mme) == in_triton
    after = metrics(mme)
    assert after["ModelLoadFailures"] - before["ModelLoadFailures"] == (target != "empty.tar.gz")


def test_infer_cli_says_tritons_reason_in_one_line_and_exits_1_when_triton_refuses_to_load_the_target(mme, capsys):
    """`infer --mme` cut Triton's load refusal off after 300 characters, before its reason (Triton named each model by
    its cache folder, `<cache>/<hash>/model::<model>`), and exited 2, the status of a mistake in the command line."""
    from tritonpack.cli import main

    assert main(["infer", "--mme", mme.url, "--target-model", "import-error.tar.gz", "hello"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: invoke import-error.tar.gz: refused: ValidationError: Triton could not load "
                           "'import-error.tar.gz' (not loaded again for 30 s unless the tarball changes): load failed "
                           "for model 'import-error.tar.gz': "), line
    assert line.endswith("RuntimeError: broken at import on purpose"), line
    assert str(mme.cache.root) not in line and " … " not in line


def test_local_mme_loads_a_target_again_when_its_load_refusal_ends_and_the_fault_has_passed(mme, models_dir, tmp_path,
                                                                                         monkeypatch):
    """Triton's refusal to load a tarball is answered from memory for `load_refusal_s`, not until the tarball changes:
    a load can fail for a cause that passes (here a file the model's import trips on), and the same tarball then
    loads."""
    import dataclasses

    fault = tmp_path / "fault"
    fault.touch()
    trips = f"import os\nif os.path.exists({str(fault)!r}): raise RuntimeError('a passing fault')"
    python_model_tarball(models_dir / "passing.tar.gz", "passing", at_import=trips)
    monkeypatch.setattr(mme.manager, "policy", dataclasses.replace(mme.manager.policy, load_refusal_s=3.0))
    before = metrics(mme)
    answer = invoke(mme, "passing.tar.gz")
    assert answer.status_code == 400 and "a passing fault" in answer.json()["message"], answer.text
    assert "not loaded again for 3 s unless the tarball changes" in answer.json()["message"]
    fault.unlink()
    assert invoke(mme, "passing.tar.gz").status_code == 400  # within the refusal: answered from memory
    assert metrics(mme)["ModelLoadFailures"] - before["ModelLoadFailures"] == 1
    time.sleep(3.0)
    answer = invoke(mme, "passing.tar.gz")
    assert answer.status_code == 200, answer.text


def test_local_mme_refuses_a_sparse_2gib_tarball_without_copying_it_when_it_lies_in_the_models_folder(mme):
    def read_bytes() -> int:
        return int(next(line for line in Path("/proc/self/io").read_text().splitlines()
                        if line.startswith("rchar")).split()[1])

    before = read_bytes()
    answer = invoke(mme, "sparse.tar.gz")
    assert answer.status_code == 400 and "no model folder" in answer.json()["message"], answer.text
    assert read_bytes() - before < 64 << 20, "the gateway read the sparse file through"
    cached = sum(f.stat().st_blocks * 512 for f in mme.cache.root.rglob("*") if f.is_file())
    assert cached < 64 << 20, f"{cached} bytes in the cache"


# ---- 3. a crashing model is contained --------------------------------------------------------------------------
def test_local_mme_quarantines_a_target_that_kills_its_stub_while_the_others_keep_serving(mme):
    before, healthy, done = metrics(mme), [], threading.Event()

    def keep_calling() -> None:
        with requests.Session() as session:
            while not done.is_set():
                answer = invoke(mme, HEALTHY[0], session=session)
                healthy.append((answer.status_code, answer.text[:300] if answer.status_code != 200 else ""))

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        first = invoke(mme, "stub-killer.tar.gz")  # its stub dies, it is loaded again, dies again: quarantined
        timing("stub_killer_first_call_s", time.monotonic() - started)
        again = invoke(mme, "stub-killer.tar.gz")
        time.sleep(0.5)
    finally:
        done.set()
        caller.join()
    for answer in (first, again):
        body = answer.json()
        assert answer.status_code == 424 and body["ErrorCode"] == "ModelError", answer.text
        assert "'stub-killer.tar.gz' is quarantined" in body["message"] and "is not healthy" in body["message"]
        assert 0 < int(answer.headers["Retry-After"]) <= POLICY.quarantine_s
    after = metrics(mme)
    faults = tuple(after[name] - before[name] for name in ("ModelCrashes", "ModelQuarantines", "TritonRestarts"))
    failed = [answer for answer in healthy if answer[0] != 200]
    assert healthy and not failed, (failed, faults, mme.triton.server.log_tail(80))
    assert faults == (2, 1, 0)
    assert "stub-killer.tar.gz" not in mme.manager.loaded_targets()
    assert json.loads(urllib.request.urlopen(f"{mme.url}/models", timeout=10).read())["quarantined"] == \
        ["stub-killer.tar.gz"]
    assert zombie_children() == []


def test_local_mme_keeps_the_log_its_error_names_when_tritonserver_does_not_start(models_dir, tmp_path, aws_env):
    from tritonpack.containers import ADDITIONAL_ARGS, CONTAINER_ENVIRONMENT
    from tritonpack.errors import ServerError

    server = LocalMME(str(models_dir), port=0, cache_dir=tmp_path / "cache",
                      environment={**CONTAINER_ENVIRONMENT, ADDITIONAL_ARGS: "--no-such-flag"})
    with pytest.raises(ServerError) as error:
        server.start()
    log = server.triton.log_path
    assert f"log: {log}" in str(error.value) and "no-such-flag" in log.read_text()  # the log was removed with it
    assert group_members(server.triton.server.process.pid) == []
    shutil.rmtree(log.parent)


def test_local_mme_quarantines_a_target_that_kills_tritonserver_and_serves_the_others_after_a_restart(
        models_dir, tmp_path, aws_env):
    server = LocalMME(str(models_dir), port=0, max_models=2, cache_dir=tmp_path / "cache", policy=POLICY).start()
    servers = [server.triton.server]
    try:
        assert invoke(server, HEALTHY[0]).status_code == 200
        for _ in range(2):  # tritonserver dies with the call, and is restarted; the second death quarantines
            answer = invoke(server, "server-killer.tar.gz")
            assert answer.status_code == 503 and answer.json()["ErrorCode"] == "ServiceUnavailable", answer.text
            assert "tritonserver exited" in answer.json()["message"] and "Retry-After" in answer.headers
            servers.append(server.triton.server)
        answer = invoke(server, "server-killer.tar.gz")
        assert answer.status_code == 424 and "quarantined" in answer.json()["message"], answer.text
        assert invoke(server, HEALTHY[0]).status_code == 200
        values = metrics(server)
        assert (values["TritonRestarts"], values["ModelQuarantines"]) == (2, 1)
        assert zombie_children() == [], "stubs of the killed servers were not reaped"
    finally:
        server.stop()
    regions = set().union(*(s.stub_shm_regions() for s in servers))
    assert regions and not regions & hostile.shm_regions(), "/dev/shm regions outlived stop()"
    assert all(group_members(s.process.pid) == [] for s in servers)


def test_local_mme_unloads_a_target_within_the_dead_unload_timeout_when_triton_still_runs_its_abandoned_call(
        tmp_path, aws_env):
    """A call whose thread gave up on Triton (no answer in time) may still run there, and an unload waits for it: the
    target is marked broken, so the next target needing its slot unloads it with the short dead-unload timeout and
    then restarts tritonserver, instead of waiting out the container's whole request timeout."""
    python_model_tarball(tmp_path / "models" / "hang.tar.gz", "hang", per_request="time.sleep(3600)")
    python_model_tarball(tmp_path / "models" / "ok.tar.gz", "ok")
    server = LocalMME(str(tmp_path / "models"), port=0, max_models=1, cache_dir=tmp_path / "cache", drain_s=1.0,
                      policy=FaultPolicy(dead_unload_timeout_s=2.0))
    server.triton.invoke_timeout_s, server.triton.timeout_s = 2.0, 30.0  # stand in for 65 s and 600 s
    server.start()
    try:
        answer = invoke(server, "hang.tar.gz")
        assert answer.status_code == 502 and "did not answer" in answer.json()["message"], answer.text
        assert [(s.target, s.active, bool(s.broken)) for s in server.manager.slots.snapshot()] == \
            [("hang.tar.gz", 0, True)]
        started = time.monotonic()
        answer = invoke(server, "ok.tar.gz")
        took = time.monotonic() - started
        timing("abandoned_call_eviction_s", took)
        assert answer.status_code == 200, answer.text
        assert took < 20 and metrics(server)["TritonRestarts"] == 1
        assert server.manager.loaded_targets() == ["ok.tar.gz"]
    finally:
        server.stop()


def test_local_mme_restarts_tritonserver_rather_than_exceed_max_models_when_a_load_outlasts_its_timeout(
        tmp_path, aws_env):
    """A load that Triton does not answer in time may still go on there: its slot is not freed for another target
    while Triton may still load it; tritonserver is restarted to end that load, and the next call is served."""
    python_model_tarball(tmp_path / "models" / "slow-load.tar.gz", "slow_load", at_import="time.sleep(3600)")
    python_model_tarball(tmp_path / "models" / "ok.tar.gz", "ok")
    server = LocalMME(str(tmp_path / "models"), port=0, max_models=1, cache_dir=tmp_path / "cache", drain_s=1.0)
    server.triton.timeout_s = 6.0  # stands in for 600 s
    server.start()
    try:
        assert invoke(server, "ok.tar.gz").status_code == 200
        answer = invoke(server, "slow-load.tar.gz")
        assert answer.status_code == 502 and "tritonserver was restarted" in answer.json()["message"], answer.text
        assert server.manager.slots.snapshot() == [] and metrics(server)["TritonRestarts"] == 1
        assert "slow_load_step" not in server.triton.server.stub_models().values()  # no load goes on in Triton
        assert invoke(server, "ok.tar.gz").status_code == 200
        assert server.manager.loaded_targets() == ["ok.tar.gz"]
        assert set(server.triton.server.stub_models().values()) == {"ok_step"}
    finally:
        server.stop()


# ---- 4. HTTP framing -------------------------------------------------------------------------------------------
def exchange(server: LocalMME, head: bytes, body_chunks=(), timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """Send a raw request (head, then body chunks while the server reads), read the answer: status, headers, body."""
    with socket.create_connection((server.host, int(server.url.rsplit(":", 1)[1])), timeout=timeout) as sock:
        sock.sendall(head)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the client finished
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536) or b"\r\n\r\n"
    head_text, _, rest = data.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, rest


PATH = b"/endpoints/local/invocations"


def post(headers: bytes) -> bytes:
    return b"POST " + PATH + b" HTTP/1.1\r\nHost: x\r\n" + TARGET_HEADER.encode() + b": a.tar.gz\r\n" + headers + \
        b"\r\n"


def chunked(total: int, size: int = 65536):
    for _ in range(total // size):
        yield b"%x\r\n" % size + b"a" * size + b"\r\n"


@pytest.mark.parametrize("name, head, body, status", [
    ("negative length", post(b"Content-Length: -1\r\n"), [b"abc"], 400),
    ("length not a number", post(b"Content-Length: abc\r\n"), [b"abc"], 400),
    ("no length", post(b""), [], 411),
    ("declared over the limit", post(b"Content-Length: 7000000\r\n"), [], 413),
    ("chunked over the limit", post(b"Transfer-Encoding: chunked\r\n"), chunked(16 << 20), 413),
    ("nested too deeply", post(b"Content-Length: 200000\r\n"), [b"[" * 200000], 400),
])
def test_local_mme_answers_the_framing_error_itself_when_a_request_is_malformed(mme, name, head, body, status):
    got, _, text = exchange(mme, head, body)
    assert got == status, (name, text[:300])
    urllib.request.urlopen(f"{mme.url}/ping", timeout=10).close()  # still serving


@pytest.mark.parametrize("method", ["PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])
def test_local_mme_answers_405_with_allow_when_invocations_get_a_wrong_method(mme, method):
    status, headers, _ = exchange(mme, method.encode() + b" " + PATH + b" HTTP/1.1\r\nHost: x\r\n"
                                                                       b"Content-Length: 0\r\n\r\n")
    assert status == 405 and headers.get("Allow") == "POST"


def test_local_mme_listens_with_a_large_backlog_when_many_clients_connect_at_once(mme):
    port = mme.url.rsplit(":", 1)[1]
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True)
    backlog = int(listening.stdout.split()[2])  # Send-Q of a listening socket: its backlog
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert backlog == min(1024, somaxconn)
    with ThreadPoolExecutor(200) as pool:
        statuses = list(pool.map(lambda _: requests.get(f"{mme.url}/ping", timeout=60).status_code, range(200)))
    assert statuses == [200] * 200


def test_local_mme_serves_a_target_named_in_utf8_when_boto3_sends_it(mme):
    answer = runtime_for(mme).invoke_endpoint(EndpointName="local", TargetModel=UTF8_TARGET, Body=text_body(),
                                              ContentType="application/json")
    assert json.loads(answer["Body"].read())["model_name"] == UTF8_TARGET


def test_local_mme_answers_400_when_the_target_header_is_not_utf8(mme):
    body = text_body()
    status, headers, body = exchange(mme, b"POST " + PATH + b" HTTP/1.1\r\nHost: x\r\n" + TARGET_HEADER.encode()
                                     + b": mod\xe8le.tar.gz\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert status == 400 and headers["x-amzn-ErrorType"] == "ValidationError" and b"not UTF-8" in body


# ---- 5. shutdown -----------------------------------------------------------------------------------------------
class Load:
    """`threads` clients on keep-alive sessions calling `target` until they cannot connect any more; records
    (start, status, Retry-After, connection error) per request."""

    def __init__(self, server: LocalMME, target: str, threads: int = 6):
        self.server, self.target, self.results = server, target, []
        self.workers = [threading.Thread(target=self._work) for _ in range(threads)]

    def _work(self) -> None:
        with requests.Session() as session:
            while True:
                started = time.monotonic()
                try:
                    answer = invoke(self.server, self.target, session=session)
                except requests.ConnectionError as e:
                    self.results.append((started, 0, None, str(e)[:200]))
                    if "refused" in str(e).lower():
                        return
                    continue
                self.results.append((started, answer.status_code, answer.headers.get("Retry-After"), ""))

    def __enter__(self) -> Load:
        for worker in self.workers:
            worker.start()
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            worker.join(timeout=120)


@pytest.mark.parametrize("drain_s, in_flight_status", [(15.0, 200), (0.3, 503)])
def test_local_mme_drains_calls_in_flight_and_answers_the_rest_503_when_it_stops(models_dir, tmp_path, aws_env,
                                                                                 drain_s, in_flight_status):
    server = LocalMME(str(models_dir), port=0, max_models=2, cache_dir=tmp_path / "cache", drain_s=drain_s).start()
    workdir, regions = server.triton._workdir, set()
    try:
        assert invoke(server, "slow.tar.gz").status_code == 200  # loaded: each call now takes ~0.5 s
        pgid, regions = server.triton.server.process.pid, server.triton.server.stub_shm_regions()
        with Load(server, "slow.tar.gz", threads=4) as load:
            time.sleep(1.5)
            stopping = time.monotonic()
            server.stop()
            stopped = time.monotonic()
        timing(f"stop_with_drain_{drain_s:g}_s", stopped - stopping)
    finally:
        server.stop()
    # in flight: sent 0.2 s or more before stop() (one sent just before may reach the gateway draining: 503)
    in_flight = {status for started, status, _, _ in load.results if started < stopping - 0.2}
    assert in_flight == {200} if in_flight_status == 200 else in_flight_status in in_flight <= {200, 503}, in_flight
    answered = [r for r in load.results if r[1]]
    assert all(status in (200, 503) for _, status, _, _ in answered), "a client saw a 4xx caused by shutdown"
    assert all(retry for _, status, retry, _ in answered if status == 503), "a 503 without Retry-After"
    refused = [r for r in load.results if not r[1]]
    assert all(started >= stopping for started, *_ in refused), f"a call in flight was dropped: {refused}"
    assert not workdir.exists(), f"{workdir} outlived stop()"
    assert group_members(pgid) == [] and regions and not regions & hostile.shm_regions()
    assert zombie_children() == []


def test_mme_command_answers_the_call_in_flight_and_exits_cleanly_when_it_gets_sigterm(models_dir, tmp_path):
    from tritonpack.server import free_port

    port, root = free_port(), Path(__file__).resolve().parents[1]
    server = SimpleNamespace(url=f"http://127.0.0.1:{port}")  # what `invoke` needs of a LocalMME
    with subprocess.Popen(
            [sys.executable, "-m", "tritonpack.cli", "mme", "--models", str(models_dir), "--port", str(port),
             "--cache-dir", str(tmp_path / "cache")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]))
    ) as command:
        try:
            first_line = command.stdout.readline()  # "starting tritonserver ...; log: <workdir>/tritonserver.log"
            workdir = Path(first_line.rsplit("log: ", 1)[1].strip()).parent
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not ping_ok(server.url):
                time.sleep(0.2)
            assert invoke(server, "slow.tar.gz").status_code == 200  # loaded: a call now takes ~0.5 s
            memory = requests.get(f"{server.url}/models", timeout=10).json()["memory_mb"]
            assert list(memory["loaded"]) == ["slow.tar.gz"] and memory["loaded"]["slow.tar.gz"] > 0
            # by default the stub is the container's Python, numpy its stand-in's (`containers.ContainerPython`)
            python = container_python(DEFAULT_CONTAINER)
            [stub] = [pid for pid in pids() if (model := stub_model_file(command_line(pid)))
                      and str(tmp_path / "cache") in str(model)]
            libraries = {Path(p).name for p in mapped_files(stub) if "/libpython3" in p}
            numpy = {p for p in mapped_files(stub) if "/site-packages/numpy/" in p}
            assert libraries == {f"libpython{python}.so.1.0"}, libraries
            assert numpy and all(f"/container-site-py{python}/" in p for p in numpy)
            with ThreadPoolExecutor(1) as pool:
                in_flight = pool.submit(invoke, server, "slow.tar.gz")
                time.sleep(0.2)
                command.send_signal(signal.SIGTERM)
                assert in_flight.result().status_code == 200
            assert command.wait(timeout=60) == 0
        finally:
            if command.poll() is None:
                command.kill()
        output = command.stdout.read()
    assert "stopping: draining" in output and "Traceback" not in output, output[-2000:]
    assert f"loaded targets and their memory: {server.url}/models" in output
    assert (f"  python models: the container's Python {python} stub: each tarball's own environment, numpy only "
            f"without one\n") in output
    assert not workdir.exists()


def ping_ok(url: str) -> bool:
    try:
        return requests.get(f"{url}/ping", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False
