"""`python -m benchmarks` (`make bench`, `make bench-smoke`): served tritonpack side by side with its peers.

Writes dist/bench/report.md, report.json and PNG plots. The first full run makes the peers' venvs under
dist/bench/peers/ (minutes). `--mode smoke` runs a small corpus once at c=1 and 8 against sentence-transformers torch
only (the peers in their own venvs are left out, `--peers cached` brings those made before back), loads 1 and 2
copies through the local MME, and leaves out dynamic batching on ÷ off and the image comparisons (each needs
another build); tests check that the report is produced, never that a number is reached.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from benchmarks.report import not_measured, row_value
from benchmarks.run import Bench, BenchSettings
from tritonpack.cli import Parser, positive


def concurrencies(text: str) -> tuple[int, ...]:
    return tuple(positive("clients")(c) for c in text.split(","))


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("full", "smoke"), default=os.environ.get("BENCH") or "full",
                   help="smoke: small corpus, one repetition, no peer installs (CI); default from $BENCH, else full")
    full, smoke = BenchSettings.for_mode("full"), BenchSettings.for_mode("smoke")
    p.add_argument("--repetitions", type=positive("repetitions"),
                   help=f"alternations per comparison (full: {full.repetitions}, smoke: {smoke.repetitions})")
    p.add_argument("--sentences", type=positive("sentences"),
                   help=f"timed corpus size (full: {full.sentences}, smoke: {smoke.sentences})")
    p.add_argument("--concurrency", type=concurrencies,
                   help="served sides' concurrencies, comma-separated (full: "
                        f"{','.join(map(str, full.concurrencies))}, smoke: {','.join(map(str, smoke.concurrencies))})")
    p.add_argument("--peers", choices=("all", "cached", "none"),
                   help="peers in their own venvs — all: make missing venvs (full) | cached: only venvs made "
                        "before | none (smoke)")
    p.add_argument("--out", default="dist/bench")
    p.add_argument("--dist", default="dist", help="where `make build` puts the export cache and `make env` the envs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # SIGTERM (and SIGINT where a background shell ignores it) end the run through its cleanup: servers stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    settings = BenchSettings.for_mode(
        args.mode, repetitions=args.repetitions, sentences=args.sentences, peers=args.peers,
        out=Path(args.out), dist=Path(args.dist),
        concurrencies=args.concurrency,
    )
    report = Bench(settings).run()
    for row in report["summary"]:
        met = "" if row["met"] is None else ("  (target met)" if row["met"] else "  (target NOT met)")
        print(f"{row['key']:40s} {row_value(row)}{met}")
    print(f"report: {settings.out / 'report.md'}")
    failed = not_measured(report)
    for key, reason in failed.items():
        print(f"{key}: not measured — {reason}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
