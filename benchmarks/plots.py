"""PNG plots beside the report: throughput and latency by concurrency, throughput by length bucket, memory by loaded
models, and every headline ratio against its target."""

from __future__ import annotations

from pathlib import Path


def _save(fig, out: Path, name: str, written: list[str]) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    written.append(name)


def _by_concurrency(plt, peers: dict, out: Path, written: list[str]) -> None:
    cs = [int(c) for c in peers["ratios_by_concurrency"]]
    by_c = peers["by_concurrency"]
    fig, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4))
    for key, side in peers["sides"].items():
        if side["served"]:
            throughput.plot(cs, [by_c[f"{key} c={c}"]["throughput_median"] for c in cs], "o-", label=side["label"])
            latency.plot(cs, [by_c[f"{key} c={c}"]["latency_p50_ms"] for c in cs], "o-", label=f"{side['label']} p50")
            latency.plot(cs, [by_c[f"{key} c={c}"]["latency_p99_ms"] for c in cs], "s--", label=f"{side['label']} p99")
        else:
            throughput.axhline(by_c[key]["throughput_median"], ls=":", color="gray")
            throughput.annotate(side["label"], (cs[0], by_c[key]["throughput_median"]), fontsize=7)
    for ax, ylabel in ((throughput, "sentences/s"), (latency, "ms per request")):
        ax.set(xlabel="concurrency (served: one sentence per request)", ylabel=ylabel, xscale="log", xticks=cs)
        ax.set_xticklabels([str(c) for c in cs])
        ax.legend(fontsize=7)
    _save(fig, out, "throughput_latency_by_concurrency.png", written)


def _by_bucket(plt, peers: dict, out: Path, written: list[str]) -> None:
    import numpy as np

    buckets = list(peers["by_bucket"])
    keys = [key for key in peers["sides"] if key in peers["by_bucket"][buckets[0]]]
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, key in enumerate(keys):
        ax.bar(np.arange(len(buckets)) + i * width, [peers["by_bucket"][b][key]["throughput_median"] for b in buckets],
               width, label=peers["sides"][key]["label"])
    ax.set_xticks(np.arange(len(buckets)) + 0.4 - width / 2)
    ax.set_xticklabels(buckets)
    ax.set(xlabel="tokens per sentence", ylabel="sentences/s", yscale="log")
    ax.legend(fontsize=7)
    _save(fig, out, "throughput_by_length.png", written)


def _memory(plt, memory: dict, out: Path, written: list[str]) -> None:
    steps = memory["steps"]
    counts = [0] + [int(n) for n in steps]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(counts, [memory["server_only"]["pss_mb"]] + [m["pss_mb"] for m in steps.values()], "o-", label="PSS summed")
    ax.plot(counts, [memory["server_only"]["rss_mb"]] + [m["rss_mb"] for m in steps.values()], "s--",
            label="RSS summed (shared pages counted per process)")
    ax.set(xlabel="bert copies loaded (local MME)", ylabel="MB, tritonserver + stubs", xticks=counts)
    ax.legend(fontsize=8)
    _save(fig, out, "memory_by_loaded_models.png", written)


def _ratios(plt, rows: list[dict], out: Path, written: list[str]) -> None:
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    ax.barh(range(len(rows)), [r["value"] for r in rows],
            color=["tab:green" if r["met"] else "tab:red" if r["met"] is False else "tab:blue" for r in rows])
    for i, r in enumerate(rows):
        if r["target"] is not None:
            ax.plot([r["target"]] * 2, [i - 0.4, i + 0.4], "k-", lw=2)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["what"][:70] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="ratio (median; black bar: target)")
    _save(fig, out, "ratios.png", written)


def write(report: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []
    peers = report.get("peers", {})
    if peers.get("sides"):
        _by_concurrency(plt, peers, out, written)
        _by_bucket(plt, peers, out, written)
    if report.get("mme", {}).get("memory"):
        _memory(plt, report["mme"]["memory"], out, written)
    rows = [r for r in report["summary"] if r["unit"] == "×"]
    if rows:
        _ratios(plt, rows, out, written)
    return written
