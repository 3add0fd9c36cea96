"""A disk that really fills: a small tmpfs (mounting one needs root, which CI has)."""

from __future__ import annotations

import contextlib
import subprocess
import tarfile
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, size_bytes: int):
    """A tmpfs of `size_bytes` at `path`, a disk that really fills (ENOSPC); yields resize(bytes)."""
    def mount(*options: str) -> None:
        done = subprocess.run(["mount", *options, str(path)], capture_output=True, text=True)
        if done.returncode:
            pytest.fail(f"this test fills a small tmpfs and needs to mount one (root): {done.stderr.strip()}")

    path.mkdir()
    mount("-t", "tmpfs", "-o", f"size={size_bytes}", "none")
    try:
        yield lambda size: mount("-o", f"remount,size={size}")
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def unpacked_bytes(tarball: Path) -> int:
    """What extracting `tarball` takes on a tmpfs: whole 4 KiB pages per file."""
    with tarfile.open(tarball) as tar:
        return sum(-(-m.size // 4096) * 4096 for m in tar.getmembers() if m.isfile())

