"""What every figure is recorded with: timed runs, CPU seconds, the load average, the machine and the versions."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tritonpack import proc

# what decides the encoder's kernels and precision: bf16 (AVX512_BF16, AMX), f16 (AVX512_FP16, AMX-FP16), int8 (VNNI)
CPU_FLAGS = ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_int8", "amx_fp16")


@dataclass
class Run:
    """One timed pass of one side over some work.

    `cpu_seconds`: CPU time used during the pass by this bench process and every process group it started
    (servers with their stubs, peer workers). Wall-clock throughput on a machine other processes load depends on
    how many runnable threads each side has; items per CPU-second does not.
    """

    items: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    cpu_seconds: float | None = None

    @property
    def per_second(self) -> float:
        return self.items / self.seconds

    @property
    def per_cpu_second(self) -> float | None:
        return self.items / self.cpu_seconds if self.cpu_seconds else None


class CpuMeter:
    """CPU seconds used so far by this process and by the process groups registered with `watch`."""

    def __init__(self) -> None:
        self.groups: set[int] = set()

    def watch(self, pgid: int) -> None:
        self.groups.add(pgid)

    def forget(self, pgid: int) -> None:
        self.groups.discard(pgid)

    def seconds(self) -> float:
        return sum(os.times()[:2]) + proc.group_cpu_seconds(self.groups)

    def measure(self, side: Callable[[], Run]) -> Run:
        before = self.seconds()
        run = side()
        run.cpu_seconds = self.seconds() - before
        return run


CPU = CpuMeter()


def alternate(tasks: dict[str, Callable[[], Run]], repetitions: int, log: Callable[[str], None]) -> dict:
    """Run every task once per repetition, in reversed order every other time (A B C, C B A, …), so that load from
    other processes falls on all alike; per-task runs in order."""
    names = list(tasks)
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for rep in range(repetitions):
        for name in names if rep % 2 == 0 else names[::-1]:
            run = CPU.measure(tasks[name])
            runs[name].append(run)
            log(f"    rep {rep + 1}/{repetitions} {name}: {run.per_second:8.1f}/s, "
                f"{run.per_cpu_second or 0:6.1f} per CPU-second")
    return runs


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def side_summary(runs: list[Run], unit: str = "sentences/s") -> dict:
    """Median throughput and latency percentiles of a side's runs; per CPU-second over the runs that measured CPU
    time (None where none did, as the GPU run's)."""
    latencies = [x for r in runs for x in r.latencies_ms]
    cpu = [r.per_cpu_second for r in runs if r.per_cpu_second]
    return {
        "throughput_median": statistics.median(r.per_second for r in runs),
        "throughput_runs": [r.per_second for r in runs],
        "per_cpu_second_median": statistics.median(cpu) if cpu else None,
        "unit": unit,
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p99_ms": percentile(latencies, 99),
    }


def ratio_summary(numerator: list[Run], denominator: list[Run], target: float | None = None) -> dict:
    """Median of the per-repetition throughput ratios (each pair ran in the same repetition)."""
    ratios = [a.per_second / b.per_second for a, b in zip(numerator, denominator)]
    median = statistics.median(ratios)
    cpu = [a.per_cpu_second / b.per_cpu_second for a, b in zip(numerator, denominator)
           if a.per_cpu_second and b.per_cpu_second]
    return {"median": median, "ratios": ratios, "target": target,
            "met": None if target is None else median >= target,
            "per_cpu_second_median": statistics.median(cpu) if cpu else None, "per_cpu_second_ratios": cpu}


class LoadMonitor:
    """Samples the 1-minute load average while the bench runs: other people's work shows up here."""

    def __init__(self, interval_s: float = 2.0):
        self.samples: list[float] = []
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.interval_s)

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"load1_min": min(s), "load1_median": statistics.median(s), "load1_max": max(s), "samples": len(s)}


def cpu_info() -> tuple[dict[str, str], set[str]]:
    """(the first CPU's /proc/cpuinfo fields, its flags), as the served encoder reads them."""
    from tritonpack.components import load_model_module

    fields = load_model_module("framework_runner", "cpu_quota").cpu_fields()
    return fields, set(fields.get("flags", "").split())


def machine() -> dict:
    fields, flags = cpu_info()
    return {
        "cpu_model": fields.get("model name", platform.processor() or "unknown"),
        # a VM may name only the vendor ("Intel(R) Xeon(R) Processor"): family and model tell the generation
        "cpu_family_model_stepping": "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")),
        "cores": os.cpu_count(),
        "cpu_flags": {flag: flag in flags for flag in CPU_FLAGS},
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def cpu_throughput(seconds: float = 0.5) -> dict:
    """The machine's dense-math and interpreter rates now, through kernels no code of this project touches: torch's
    512×512 matrix product in f32 and in bf16 (AMX or AVX512_BF16 where the CPU has them) on its default threads, and
    a pure-Python loop. Taken at a run's start and end, they are what runs of different hours are compared against:
    one hour the same VM ran every vector-bound side at 0.5–0.7× its morning rate at the same load average, and
    nothing in the report said so. In such an hour these fell 10–20 % (docs/performance.md, sixtieth round)."""
    import torch

    def rate(step: Callable[[], object], operations: int) -> float:
        step()  # first call: allocation, kernel choice
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            step()
            count += 1
        return count * operations / elapsed

    def python_loop() -> int:
        total = 0
        for i in range(10_000):
            total += i
        return total

    f32 = torch.rand(512, 512)
    bf16 = f32.to(torch.bfloat16)
    flops = 2 * 512**3
    return {"threads": torch.get_num_threads(), "f32_matmul_gflops": rate(lambda: f32 @ f32, flops) / 1e9,
            "bf16_matmul_gflops": rate(lambda: bf16 @ bf16, flops) / 1e9,
            "python_loop_million_per_s": rate(python_loop, 10_000) / 1e6}


BENCH_PACKAGES = ("nvidia-pytriton", "tritonclient", "openvino", "onnxruntime", "torch", "sentence-transformers",
                  "transformers", "tokenizers", "numpy", "nvidia-dali-cuda120", "pillow")


def versions(names: Sequence[str] = BENCH_PACKAGES) -> dict:
    from benchmarks import peer_worker

    return {**peer_worker.versions(names), "tritonserver": "2.51 (bundled in nvidia-pytriton 0.7.0)"}


def busiest_processes(top: int = 5) -> list[dict]:
    """The processes (other than this one) that used the most CPU in the last second."""
    before = {p.pid: p.cpu_seconds for p in proc.processes()}
    time.sleep(1.0)
    busy = [{"pid": p.pid, "cpu_percent": round(100 * (p.cpu_seconds - before[p.pid])),
             "command": b" ".join(proc.command_line(p.pid)).decode(errors="replace")[:120]}
            for p in proc.processes() if p.pid in before and p.pid != os.getpid()]
    return sorted([b for b in busy if b["cpu_percent"] > 5], key=lambda b: -b["cpu_percent"])[:top]
