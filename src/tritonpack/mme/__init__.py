"""A local SageMaker multi-model endpoint: a gateway in front of Triton's own SageMaker front-end.

The gateway plays the part of SageMaker's MME platform: it answers InvokeEndpoint
(`POST /endpoints/<name>/invocations` with `X-Amzn-SageMaker-Target-Model`) and `/ping`; on the first call for a
target it checks the tarball where it lies (folder or S3), extracts it safely into a disk cache, loads it through
the container contract and invokes it; it keeps at most `--max-models` loaded, bounds the disk cache, contains
targets that crash, and serves SageMaker's MME metrics in Prometheus text format at `/metrics`.

Modules: `sources` (folder, S3), `store` (disk cache, admission), `container` (tritonserver's SageMaker front-end),
`health` (restart budget, crash ledger), `recovery` (a dead or stuck server), `manager` (model slots), `gateway`
(HTTP), `local` (`LocalMME`), `command` (`tritonpack mme`), `request_guard`, `metrics`.
"""

from __future__ import annotations

from tritonpack.mme.command import add_command

__all__ = ["LocalMME", "add_command", "parse_metrics"]


def __getattr__(name: str):
    # LocalMME brings in aiohttp and the server: only when asked for, not for every `tritonpack` command.
    if name == "LocalMME":
        from tritonpack.mme.local import LocalMME

        return LocalMME
    if name == "parse_metrics":
        from tritonpack.mme.metrics import parse_metrics

        return parse_metrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
