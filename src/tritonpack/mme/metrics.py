"""The local MME's metrics: SageMaker's MME CloudWatch metrics by their CloudWatch names, plus the gateway's own
fault counters, served in Prometheus text format at `/metrics`."""

from __future__ import annotations

import threading


class Metrics:
    HELP = {
        "LoadedModelCount": ("gauge", "models loaded in Triton now"),
        "ModelCacheHit": ("counter", "invocations whose target was already loaded"),
        "ModelCacheMiss": ("counter", "invocations that had to wait for their target to be loaded"),
        "Invocations": ("counter", "InvokeEndpoint requests answered"),
        "Invocation4XXErrors": ("counter", "invocations answered with a 4xx status"),
        "Invocation5XXErrors": ("counter", "invocations answered with a 5xx status"),
        "InvocationRetries": ("counter", "invocations the gateway tried again (reasons in its log)"),
        "ModelDiskEvictions": ("counter", "extracted targets removed from the disk cache"),
        "ModelLoadFailures": ("counter", "targets Triton refused to load (the loaded set was left as it was)"),
        "ModelCrashes": ("counter", "python stub or tritonserver deaths charged to a target"),
        "ModelQuarantines": ("counter", "times a target was refused for a while after repeated crashes"),
        "QuarantinedModelCount": ("gauge", "targets refused now because they crashed repeatedly"),
        "TritonRestarts": ("counter", "times tritonserver was restarted (it died, or a target would not unload)"),
        "ModelReloads": ("counter", "targets unloaded and loaded again because one of their python stubs died"),
        "ModelLoadingWaitTime": ("summary", "seconds an invocation waited for its target to be fetched and loaded"),
        "ModelDownloadingTime": ("summary", "seconds spent fetching a tarball from the model source"),
        "ModelCheckingTime": ("summary", "seconds `tritonpack check` took on a fetched tarball, whose one read "
                                            "also unpacks it into a staging folder"),
        "ModelExtractingTime": ("summary", "seconds spent placing a checked tarball's unpacked folder in the disk "
                                           "cache"),
        "ModelLoadingTime": ("summary", "seconds Triton took to load a target"),
        "ModelUnloadingTime": ("summary", "seconds Triton took to unload a target"),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, float] = {name: 0.0 for name, (kind, _) in self.HELP.items() if kind != "summary"}
        self.summaries: dict[str, list[float]] = {name: [0, 0.0] for name, (kind, _) in self.HELP.items()
                                                  if kind == "summary"}

    def inc(self, name: str, by: float = 1.0) -> None:
        with self._lock:
            self.values[name] += by

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.values[name] = value

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self.summaries[name][0] += 1
            self.summaries[name][1] += seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = dict(self.values)
            for name, (count, total) in self.summaries.items():
                out[f"{name}_count"], out[f"{name}_sum"] = count, total
            return out

    def render(self) -> str:
        values = self.snapshot()
        lines = []
        for name, (kind, help_text) in self.HELP.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            if kind == "summary":
                lines += [f"{name}_count {_number(values[name + '_count'])}",
                          f"{name}_sum {values[name + '_sum']:.6f}"]
            else:
                lines.append(f"{name} {_number(values[name])}")
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """Every digit of a count (`:g` kept six: 1,234,567 read back as 1,234,570)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_metrics(text: str) -> dict[str, float]:
    """`name value` lines of a Prometheus text exposition (no labels), for tests and scripts."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out
