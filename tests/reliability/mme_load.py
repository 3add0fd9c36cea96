"""A bounded load run of the local MME with faults injected on a schedule, measured from the clients' side.

`tritonpack mme` (the real command, its real tritonserver) serves tiny python-backend targets; locust users call
the healthy ones in a closed loop (tests/reliability/mme_locustfile.py) while this script, at fixed times: kills the
python stub of a healthy target, invokes a target whose `execute` kills its stub, SIGKILLs tritonserver, invokes a
target that kills tritonserver, and finally sends SIGTERM to the gateway under load. For each fault the report gives
the gateway's behaviour, how long the healthy targets took to answer 200 again, and the healthy requests that got
no 200 (requests lost); for the shutdown, the calls in flight that were lost and what was left behind.

    python -m tests.reliability.mme_load [--users 8] [--phase-s 12] [--out dist/mme-load]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.mme_support import SERVER_KILLER, STUB_KILLER, python_model_tarball, text_body
from tests.reliability import hostile
from tritonpack.mme.container import TARGET_HEADER
from tritonpack.mme.metrics import parse_metrics
from tritonpack.proc import group_members
from tritonpack.server import free_port

HEALTHY = ("a.tar.gz", "b.tar.gz", "c.tar.gz")
LOCUSTFILE = Path(__file__).with_name("mme_locustfile.py")
WATCHED = ("ModelReloads", "ModelCrashes", "ModelQuarantines", "TritonRestarts", "InvocationRetries")


@dataclass
class Fault:
    name: str
    at: float  # Unix time the fault was injected
    behaviour: str = ""
    healthy_requests: int = 0
    healthy_lost: int = 0  # healthy requests that ended in this phase without a 200
    lost_reasons: dict = field(default_factory=dict)  # status and error text → count
    slowest_s: float = 0.0  # the longest wait of a healthy request that ended in this phase
    recovery_s: float = 0.0  # from the fault to the end of the last healthy request that failed or took > 1 s
    metrics: dict = field(default_factory=dict)  # the gateway's counters that moved during the phase


@dataclass
class LoadReport:
    users: int
    requests: int = 0
    faults: list[Fault] = field(default_factory=list)
    shutdown: dict = field(default_factory=dict)
    cpu: str = ""

    def markdown(self) -> str:
        lines = [f"Local MME load run: {self.users} locust users on 3 healthy targets (`--max-models 4`: room for "
                 f"one faulty target), {self.requests} requests; CPU: {self.cpu}", "",
                 "| fault | behaviour | gateway counters | healthy requests | lost (no 200) | slowest | recovery |",
                 "|---|---|---|---|---|---|---|"]
        for f in self.faults:
            lost = f"{f.healthy_lost}" + (f" ({'; '.join(f'{k} ×{v}' for k, v in f.lost_reasons.items())})"
                                          if f.lost_reasons else "")
            moved = ", ".join(f"{k} +{v:g}" for k, v in f.metrics.items())
            lines.append(f"| {f.name} | {f.behaviour} | {moved} | {f.healthy_requests} | {lost} | "
                         f"{f.slowest_s:.2f} s | {f.recovery_s:.2f} s |")
        s = self.shutdown
        lines.append(f"| SIGTERM under load | {s.get('behaviour', '')} | | {s.get('in_flight', 0)} in flight | "
                     f"{s.get('in_flight_lost', 0)} | | exited in {s.get('exit_s', 0):.2f} s |")
        return "\n".join(lines) + "\n"


def invoke(url: str, target: str) -> tuple[int, str]:
    request = urllib.request.Request(f"{url}/endpoints/local/invocations", data=text_body(), method="POST",
                                     headers={TARGET_HEADER: target,
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}").get("message", "")[:160]


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return parse_metrics(response.read().decode())


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def tritonserver_of(gateway: subprocess.Popen) -> int:
    return next(p for p in children(gateway.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "tritonserver")


def stub_of(server_pid: int, model_folder: str) -> int:
    for pid in group_members(server_pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"triton_python_backend_stub" in args[0] and f"/{model_folder}/".encode() in args[1]:
            return pid
    raise LookupError(f"no stub of {model_folder}")


def wait_ping(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/ping", timeout=2).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url}/ping did not answer")


def read_log(path: Path) -> list[tuple[float, str, int, float, str, str]]:
    with open(path, newline="") as f:
        return [(float(r[0]), r[1], int(r[2]), float(r[3]), r[4], r[5]) for r in csv.reader(f) if r]


def write_models(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for target in HEALTHY:
        python_model_tarball(folder / target, f"ok_{target[0]}")
    python_model_tarball(folder / "stub-killer.tar.gz", "stub_killer", per_request=STUB_KILLER)
    python_model_tarball(folder / "server-killer.tar.gz", "server_killer", per_request=SERVER_KILLER)
    return folder


def run(out: Path, users: int = 8, phase_s: float = 12.0) -> LoadReport:
    out.mkdir(parents=True, exist_ok=True)
    models, log_path, port = write_models(out / "models"), out / "requests.csv", free_port()
    log_path.unlink(missing_ok=True)
    url, root = f"http://127.0.0.1:{port}", Path(__file__).parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")]),
               MME_LOAD_LOG=str(log_path))
    report = LoadReport(users, cpu=cpu_model())
    regions_before, servers = hostile.shm_regions(), []  # every tritonserver the gateway runs, for what is left
    with ExitStack() as stack:
        gateway_log, locust_log = (stack.enter_context(open(out / name, "w")) for name in ("gateway.log", "locust.log"))
        gateway = subprocess.Popen([sys.executable, "-m", "tritonpack.cli", "mme", "--models", str(models), "--port",
                                    str(port), "--max-models", "4", "--cache-dir", str(out / "cache"),
                                    "--drain-seconds", "10"], env=env, stdout=gateway_log, stderr=subprocess.STDOUT)
        stack.callback(lambda: gateway.poll() is None and gateway.kill())
        wait_ping(url)
        for target in HEALTHY:  # loaded before the load starts: cold starts are measured elsewhere (bench P4)
            assert invoke(url, target)[0] == 200
        workdir = Path(re.search(r"log: (\S+)/tritonserver\.log", (out / "gateway.log").read_text())[1])
        locust = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u",
                                   str(users), "-r", str(users), "--host", url, "--only-summary"], env=env,
                                  stdout=locust_log, stderr=subprocess.STDOUT)
        stack.callback(lambda: locust.poll() is None and locust.kill())
        time.sleep(phase_s)
        servers.append(tritonserver_of(gateway))
        report.faults = inject_faults(url, gateway, phase_s, servers)
        servers.append(tritonserver_of(gateway))
        time.sleep(phase_s / 2)
        terminated = time.time()
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=120)
        exited = time.time()
        time.sleep(2)  # the clients meet a closed port
        locust.send_signal(signal.SIGTERM)
        locust.wait(timeout=60)
    requests = read_log(log_path)
    report.requests = len(requests)
    judge_faults(report.faults, requests, terminated)
    report.shutdown = judge_shutdown(requests, terminated, exited, servers, regions_before, workdir)
    (out / "report.json").write_text(json.dumps(asdict(report), indent=1))
    (out / "report.md").write_text(report.markdown())
    return report


def inject_faults(url: str, gateway: subprocess.Popen, phase_s: float, servers: list[int]) -> list[Fault]:
    """The four faults, one phase each; `servers` gets each tritonserver a fault ends."""
    faults = []

    def phase(name: str, action) -> None:
        before = counters(url)
        fault = Fault(name, time.time())
        fault.behaviour = action()
        time.sleep(phase_s)
        after = counters(url)
        fault.metrics = {k: after[k] - before[k] for k in WATCHED if after[k] != before[k]}
        faults.append(fault)

    def kill_stub() -> str:
        os.kill(stub_of(tritonserver_of(gateway), "ok_a_step"), signal.SIGKILL)
        return "stub of a.tar.gz killed: next calls reload it and are retried"

    def stub_killer() -> str:
        answers = [invoke(url, "stub-killer.tar.gz") for _ in range(3)]
        return "; ".join(f"{status}" + (" quarantined" if "quarantined" in text else "") for status, text in answers)

    def kill_server() -> str:
        servers.append(tritonserver_of(gateway))
        os.kill(servers[-1], signal.SIGKILL)
        return "tritonserver SIGKILLed: calls in it get 503 + Retry-After, restarted by the watchdog"

    def server_killer() -> str:
        servers.append(tritonserver_of(gateway))
        status, text = invoke(url, "server-killer.tar.gz")
        return f"{status}: {text[:70]}"

    phase("python stub of a healthy target killed", kill_stub)
    phase("target whose execute kills its stub, called 3 times", stub_killer)
    phase("tritonserver SIGKILLed", kill_server)
    phase("target that kills tritonserver, called once", server_killer)
    return faults


def judge_faults(faults: list[Fault], requests, terminated: float) -> None:
    ends = [f.at for f in faults[1:]] + [terminated]
    for fault, end in zip(faults, ends, strict=True):
        phase = [r for r in requests if fault.at <= r[0] + r[3] < end and r[1] in HEALTHY]  # ended in the phase
        lost = [r for r in phase if r[2] != 200]
        fault.healthy_requests, fault.healthy_lost = len(phase), len(lost)
        for r in lost:
            key = f"{r[2] or 'no answer'} {reason_of(r[5])}"
            fault.lost_reasons[key] = fault.lost_reasons.get(key, 0) + 1
        fault.slowest_s = max((r[3] for r in phase), default=0.0)
        fault.recovery_s = max((r[0] + r[3] - fault.at for r in phase if r[2] != 200 or r[3] > 1.0), default=0.0)


def reason_of(text: str) -> str:
    """The gateway's message (or the client's exception) without its variable parts, to count reasons."""
    message = re.search(r'"message": "([^"]*)', text)
    return re.sub(r"\d+(\.\d+)?", "N", (message[1] if message else text).split(";")[0])[:70]


def judge_shutdown(requests, terminated: float, exited: float, servers: list[int], regions_before: set[str],
                   workdir: Path) -> dict:
    """How SIGTERM under load went: every call in flight answered 200, or 503 with Retry-After; nothing of any
    tritonserver the run started left (processes of their groups, /dev/shm regions, the working folder)."""
    in_flight = [r for r in requests if r[0] < terminated <= r[0] + r[3]]
    after = [r for r in requests if r[0] >= terminated]
    statuses = {}
    for r in after:
        statuses[str(r[2] or "refused")] = statuses.get(str(r[2] or "refused"), 0) + 1
    return {
        "behaviour": f"in flight: {sum(r[2] == 200 for r in in_flight)} answered 200, "
                     f"{sum(r[2] == 503 for r in in_flight)} 503 + Retry-After; sent later: {statuses}",
        "in_flight": len(in_flight),
        "in_flight_lost": sum(not (r[2] == 200 or (r[2] == 503 and r[4])) for r in in_flight),
        "after_sigterm": statuses,
        "answered_4xx": sum(400 <= r[2] < 500 for r in requests if r[0] >= terminated - 1),
        "503_without_retry_after": sum(r[2] == 503 and not r[4] for r in requests),
        "exit_s": exited - terminated,
        "processes_left": sorted({pid for server in servers for pid in group_members(server)}),
        "shm_regions_left": sorted(hostile.shm_regions() - regions_before),
        "workdir_left": workdir.exists(),
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.mme_load", description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--phase-s", type=float, default=12.0)
    parser.add_argument("--out", type=Path, default=Path("dist/mme-load"))
    args = parser.parse_args(argv)
    report = run(args.out, args.users, args.phase_s)
    print(report.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
