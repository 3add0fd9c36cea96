"""`tritonpack check PATH [--deep]`: will this repository folder or MME tarball load, and if not, why.

A tarball is read once, as a stream: the archive safety checks (`tritonpack.archive`) run on every member before
anything else looks at it (`tree`), then the structural checks run on what was read (`structure`). `--deep` then
opens each native model's artifact with its framework's own Python library and compares it with the config as
its Triton backend does at load and at the first request (`deep`); a tarball's artifacts are extracted into a
temporary folder for that, and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

from tritonpack.archive import ArchiveLimits, Problem
from tritonpack.check.cli import add_command, cmd_check
from tritonpack.check.structure import CheckReport, ServerPython, check_tree
from tritonpack.check.tree import KnownEnvs, Tree, inspect_env, read_folder, read_tarball

__all__ = ["CheckReport", "KnownEnvs", "ServerPython", "Tree", "add_command", "check", "check_tree", "cmd_check",
           "deep_problems", "inspect_env"]


def check(path: Path, limits: ArchiveLimits | None = None, python: str | None = None,
          container: str | None = None, deep: bool = False,
          server: ServerPython | None = None, known_envs: KnownEnvs | None = None,
          unpack_to: Path | None = None) -> CheckReport:
    """Problems (deployment would fail) and warnings of a repository folder or MME tarball; with `deep`, also what
    each native model's backend would answer about its artifact (`report.unchecked` says what could not be
    checked here). `server`: the Python a python model without a packed environment runs in (default: a stock
    Triton container's, which has numpy only). `known_envs`: a tarball's packed environments already inspected by
    this caller, by their bytes (a gateway checking many tarballs). `unpack_to`: a tarball's members are also
    written into this new folder by the same read, whatever the verdict (`read_tarball`)."""
    path = Path(path)
    limits = limits or ArchiveLimits()
    if path.is_dir():
        if unpack_to is not None:
            raise ValueError(f"unpack_to is for a tarball; {path} is a folder")
        tree, problems = read_folder(path, limits)
    elif path.is_file():
        tree, problems = read_tarball(path, limits, known_envs, unpack_to)
        if problems:  # unsafe archives are not looked at any further
            return CheckReport(str(path), problems)
    else:
        what = "not a regular file or folder" if path.exists() else "no such file or folder"
        return CheckReport(str(path), [Problem(str(path), "path", what)])
    report = check_tree(tree, path.name, python=python, container=container, server=server)
    report.path = str(path)
    report.problems[:0] = problems
    if deep:
        from tritonpack.check.deep import deep_check

        findings = deep_check(path, report.configs, limits)
        report.problems += findings.problems
        report.warnings += findings.warnings
        report.unchecked += findings.unchecked
    return report


def deep_problems(path: Path, limits: ArchiveLimits | None = None) -> list[Problem]:
    """Only the `--deep` findings: each native model's artifact against its config, for a folder or tarball the
    structural checks could read (`check(path, deep=True)` gives both kinds together)."""
    from tritonpack.check.deep import deep_check

    limits = limits or ArchiveLimits()
    report = check(path, limits)
    return deep_check(Path(path), report.configs, limits).problems if report.configs else []
