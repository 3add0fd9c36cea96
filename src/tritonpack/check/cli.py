"""`tritonpack check PATH [--deep] [--container X | --python X.Y | --local]`: one line per problem, exit 0 if
deployable."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tritonpack.archive import ArchiveLimits
from tritonpack.containers import python_minor
from tritonpack.errors import UserError


def cmd_check(args) -> int:
    from tritonpack.check import check
    from tritonpack.cli import build_hint

    path = Path(args.path)
    if not path.exists():
        raise UserError(f"{args.path}: no such file or folder; {build_hint(path)}")
    if path.is_dir() and not any(path.glob("*/config.pbtxt")):
        built = sorted(path.glob("*.tar.gz")) + sorted({p.parent.parent for p in path.glob("*/*/config.pbtxt")})
        if built:  # dist/ itself: a folder of repositories and tarballs is not one repository
            raise UserError(f"{args.path} holds {len(built)} built repositories and tarballs, not one repository; "
                            f"check one: `tritonpack check {built[0]}`")
    given = {"max_members": args.max_members, "max_total_bytes": args.max_total_bytes}
    limits = ArchiveLimits(**{field: value for field, value in given.items() if value is not None})
    if args.local:  # the bundled Triton: its stub runs this interpreter, whose packages the models may use
        from tritonpack.server import PYTHON_VERSION, local_server_python

        # a folder as `tritonpack serve` runs it; a tarball as the local MME checks it before loading
        python = PYTHON_VERSION if path.is_dir() else None
        report = check(path, limits, python=python, deep=args.deep, server=local_server_python())
    else:
        report = check(path, limits, python=args.python, container=args.container, deep=args.deep)
    for problem in report.problems:
        print(printable(str(problem)))
    for warning in report.warnings:
        print(printable(f"warning: {warning}"), file=sys.stderr)
    for unchecked in report.unchecked:
        print(printable(f"not checked: {unchecked}"), file=sys.stderr)
    if report.ok:
        print(f"ok: {args.path} is deployable ({len(report.models)} models, entry {report.ensemble})",
              file=sys.stderr)
        return 0
    print(f"{args.path}: {len(report.problems)} problem(s); not deployable", file=sys.stderr)
    return 1


def add_command(subparsers) -> None:
    from tritonpack.cli import positive

    c = subparsers.add_parser("check", help="will this repository folder or MME tarball load? (exit 0 if so)",
                              description="Checks configs, artifacts, ensemble wiring, packed environments and "
                                          "archive safety without extracting; one line per problem: "
                                          "file: field: reason.")
    c.add_argument("path", help="a repository folder or a .tar.gz")
    c.add_argument("--deep", action="store_true",
                   help="also open each native model's artifact (ONNX, TorchScript, graphdef, DALI pipeline, "
                        "TensorRT plan, OpenVINO) with its framework, compare it with the config as its Triton "
                        "backend does and run it once on the CPU; seconds per model (a tarball's artifacts are "
                        "extracted to a temporary folder only)")
    target = c.add_mutually_exclusive_group()
    target.add_argument("--container", help="Triton container version the target runs (e.g. 24.10); its Python "
                                            "must match the packed envs' (default: manifest.json's python_version)")
    target.add_argument("--python", type=python_minor, help="the target stub's Python minor version, e.g. 3.10")
    target.add_argument("--local", action="store_true",
                        help="for the local Triton: a folder as `tritonpack serve` runs it (its stub runs this "
                             "interpreter, whose packages the python models may import without a packed "
                             "environment), a tarball as the local MME loads it")
    c.add_argument("--max-members", type=positive("archive entries"),
                   help=f"archive entry limit (default {ArchiveLimits.max_members})")
    c.add_argument("--max-total-bytes", type=positive("bytes"),
                   help=f"archive unpacked size limit (default {ArchiveLimits.max_total_bytes})")
    c.set_defaults(func=cmd_check)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(line: str) -> str:
    """`line` with a member name's undecodable bytes (tarfile keeps them as surrogates) and control characters
    written as escapes: the first raised UnicodeEncodeError on a strict UTF-8 stdout, the others (newline, carriage
    return, terminal escapes) let a name forge or hide output lines."""
    line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", line)
