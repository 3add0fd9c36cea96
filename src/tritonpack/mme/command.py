"""`tritonpack mme`: the local multi-model endpoint from the command line. SIGTERM or Ctrl-C stops it gracefully:
no new connections, calls in flight finish (up to --drain-seconds), tritonserver stops, nothing is left behind."""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
from pathlib import Path

from tritonpack.aws import endpoint_url
from tritonpack.containers import (
    ADDITIONAL_ARGS,
    AUTO,
    CONTAINER_ENVIRONMENT,
    CONTAINER_PYTHON,
    containers_for,
    parse_environment,
    python_minor,
)
from tritonpack.errors import UserError
from tritonpack.mme.request_guard import MAX_PAYLOAD_BYTES

LOCAL = "local"  # --container-python: this interpreter's stub
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """`20G`, `512MiB`, `1000000` → bytes (binary multiples)."""
    match = SIZE.match(str(text))
    if not match:
        raise UserError(f"not a size: {text!r} (examples: 20G, 512M, 1000000)")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " kmgt".index(unit.lower() or " "))


def container_python_option(text: str) -> str:
    """`--container-python`'s value (argparse type): auto, local or the Python minor version of a container."""
    if text in (AUTO, LOCAL):
        return text
    if not containers_for(python_minor(text)):
        known = ", ".join(f"{python} ({', '.join(containers_for(python))})"
                          for python in dict.fromkeys(python for _, _, python in CONTAINER_PYTHON))
        raise argparse.ArgumentTypeError(f"no Triton container runs Python {text}: theirs are {known}")
    return text


def seconds(text: str) -> float:
    """argparse type of a duration: 0 or more seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return value


def cmd_mme(args) -> int:
    from tritonpack.cli import stopped_by_signals, wait_for_stop
    from tritonpack.mme.local import LocalMME
    from tritonpack.server import PYTHON_VERSION

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        mme = LocalMME(args.models, port=args.port, host=args.host, max_models=args.max_models,
                       cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                       cache_bytes=parse_bytes(args.cache_bytes), s3_endpoint_url=args.s3_endpoint_url,
                       max_payload_bytes=args.max_payload_bytes, drain_s=args.drain_seconds,
                       triton_log=Path(args.triton_log) if args.triton_log else None,
                       environment=parse_environment(args.env, CONTAINER_ENVIRONMENT),
                       container_python=None if args.container_python == LOCAL else args.container_python)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    print(f"starting tritonserver (SageMaker front-end, MME mode); log: {mme.triton.log_path}", flush=True)
    try:
        with stopped_by_signals():
            try:
                mme.start()
            except OSError as e:
                raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
            with mme:
                container = mme.triton.container_python
                stub = (f"the container's Python {container.version} stub: each tarball's own environment, numpy "
                        f"only without one" if container else
                        f"this interpreter's Python {PYTHON_VERSION} stub and packages")
                print(f"local MME on {mme.url}: models from {mme.source}, at most {args.max_models} loaded, "
                      f"disk cache {mme.cache.root} ({args.cache_bytes})\n  python models: {stub}\n"
                      f"  invoke: aws sagemaker-runtime invoke-endpoint --endpoint-url {mme.url} --endpoint-name "
                      f"local --target-model <tarball> ...\n  metrics: {mme.url}/metrics\n"
                      f"  loaded targets and their memory: {mme.url}/models", flush=True)
                wait_for_stop(lambda: True)
                print(f"stopping: draining calls in flight (up to {args.drain_seconds:g} s)", flush=True)
    except KeyboardInterrupt:  # while it was starting: start() stopped what it had started
        print("interrupted before the local MME was ready; stopped", file=sys.stderr)
        return 130
    return 0


def add_command(subparsers) -> None:
    from tritonpack.cli import port_number, positive

    p = subparsers.add_parser("mme", help="serve MME tarballs locally, as a SageMaker multi-model endpoint would",
                              description="A local SageMaker multi-model endpoint: InvokeEndpoint on --port in "
                                          "front of tritonserver's SageMaker front-end. " + (__doc__ or ""))
    p.add_argument("--models", required=True, help="folder of tarballs, or s3://bucket/prefix")
    p.add_argument("--port", type=port_number, default=8080, help="gateway port (default 8080; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    p.add_argument("--max-models", type=positive("models"), default=8,
                   help="models loaded at once; least recently used are unloaded beyond it (default 8)")
    p.add_argument("--cache-dir", help="where tarballs are extracted (default ~/.cache/tritonpack/mme)")
    p.add_argument("--cache-bytes", default="20G", help="disk cache bound; extracted folders of unloaded "
                                                        "models are removed beyond it (default 20G)")
    p.add_argument("--s3-endpoint-url", type=endpoint_url,
                   help="S3 endpoint for s3:// models (an S3-compatible store, moto)")
    p.add_argument("--max-payload-bytes", type=positive("bytes"), default=MAX_PAYLOAD_BYTES,
                   help=f"largest request body (default {MAX_PAYLOAD_BYTES}, SageMaker's limit)")
    p.add_argument("--drain-seconds", type=seconds, default=30.0,
                   help="on SIGTERM/Ctrl-C, how long calls in flight may finish before they are answered 503 "
                        "(default 30)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE",
                   help="container environment over the one `tritonpack deploy` sets (repeatable); serve's shared "
                        f"memory sizes and {ADDITIONAL_ARGS} apply here, e.g. --env {ADDITIONAL_ARGS}= runs Triton "
                        "as a stock endpoint does (auto-complete on)")
    p.add_argument("--triton-log", help="keep tritonserver's log in this file (default: a temporary folder, "
                                        "removed at stop)")
    p.add_argument("--container-python", type=container_python_option, default=AUTO, metavar="X.Y|auto|local",
                   help="run the stub of the container's Python (e.g. 3.10 for 24.09) with a local pythonX.Y, so "
                        "each tarball runs from the environment it packs for that Python, as on the endpoint; "
                        "local: this interpreter's stub and packages; auto (default): the default container's "
                        "Python where this machine can run its stub, else local, saying why")
    p.set_defaults(func=cmd_mme)
