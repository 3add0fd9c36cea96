"""The disk cache a local MME extracts targets into, and the admission of a tarball into it.

The cache mirrors the SageMaker Triton container's layout: each target is extracted to `<cache>/<hash>/model`,
the only url shape Triton 2.73's SageMaker front-end accepts, with `<hash>` derived from the target name.
A tarball is checked where it lies: a local one is never copied (a huge or sparse file costs what the check reads
of it), an S3 one is downloaded once into a staging folder. The check's one read also unpacks it into that staging
folder, which becomes the target's folder only when the check found no problem.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tritonpack.errors import UserError, disk_full
from tritonpack.mme.metrics import Metrics
from tritonpack.mme.sources import TargetError, target_hash, unreachable

log = logging.getLogger("tritonpack.mme")
T = TypeVar("T")
INSUFFICIENT_STORAGE = 507
# downloads and unpacked files are staged beside the entries, in `.download-<8 of the target's hash>-<random>`
STAGING = ".download-"
# What the cache writes: `<hash>` (`sources.target_hash`) folders and staging folders
LEFT_BEHIND = re.compile(rf"[0-9a-f]{{32}}|{re.escape(STAGING)}[0-9a-f]{{8}}-\w+")


@dataclass
class CacheEntry:
    target: str
    version: str
    bytes: int
    last_used: float

    @property
    def hash(self) -> str:
        return target_hash(self.target)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


class DiskCache:
    """Extracted targets under `root/<hash>/model`, bounded to `max_bytes` by evicting least recently used ones.

    Only entries the caller says are not in use (not loaded in Triton) are evicted. Entries left by an earlier
    run are found again at start-up (`<hash>/source.json` names their target and version). One cache at a time uses
    `root`: it holds an exclusive lock on the folder until `close` (another would remove what this one is writing).
    """

    def __init__(self, root: Path, max_bytes: int):
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if disk_full(e):
                raise
            raise UserError(f"--cache-dir {root}: cannot create it ({e.strerror}); name a folder this user may "
                            f"write") from None
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by tritonserver
        self.close = weakref.finalize(self, os.close, fd)  # unlocks: on `close()`, or once nothing refers to the cache
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise UserError(f"--cache-dir {root}: another local MME uses this disk cache; start this one with another "
                            f"--cache-dir, or stop the other") from None
        self._lock = threading.Lock()
        self.entries: dict[str, CacheEntry] = {}
        for folder in self.root.iterdir():
            entry = self._recorded(folder)
            if entry is not None:
                self.entries[entry.target] = entry
            elif LEFT_BEHIND.fullmatch(folder.name) and folder.is_dir() and not folder.is_symlink():
                # a download or an extraction that a killed run cut short: counted by nothing, so removed
                log.info("removing %s, left in the cache by an earlier run", folder)
                shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    def _recorded(folder: Path) -> CacheEntry | None:
        """The entry `folder` holds when its `source.json` names its target and its `model` folder is there."""
        meta = folder / "source.json"
        try:
            data = json.loads(meta.read_text())
            entry = CacheEntry(data["target"], data["version"], int(data["bytes"]), meta.stat().st_mtime)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return entry if entry.hash == folder.name and (folder / "model").is_dir() else None

    def model_dir(self, target: str) -> Path:
        return self.root / target_hash(target) / "model"

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.bytes for e in self.entries.values())

    def lookup(self, target: str, version: str) -> Path | None:
        """The extracted folder of `target` at `version`, if the cache has it."""
        with self._lock:
            entry = self.entries.get(target)
            if entry is None or entry.version != version or not self.model_dir(target).is_dir():
                return None
            entry.last_used = time.time()
            return self.model_dir(target)

    def staging_dir(self, target: str) -> Path:
        """A fresh folder beside the entries for a download and its unpacked files (the caller removes it)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{STAGING}{target_hash(target)[:8]}-", dir=self.root))

    def place(self, target: str, version: str, unpacked: Path) -> Path:
        """Move `unpacked` (a checked tarball's files, in a `staging_dir` of this cache) to `<hash>/model`, and an
        earlier version's folder there into that staging folder, which the caller removes; record it."""
        entry_dir = self.root / target_hash(target)
        with self._lock:
            self.entries.pop(target, None)
        (entry_dir / "source.json").unlink(missing_ok=True)
        model_dir = entry_dir / "model"
        entry_dir.mkdir(exist_ok=True)
        if model_dir.exists():
            model_dir.rename(unpacked.parent / "replaced")
        unpacked.rename(model_dir)
        size = folder_bytes(model_dir)
        (entry_dir / "source.json").write_text(json.dumps({"target": target, "version": version, "bytes": size}))
        with self._lock:
            self.entries[target] = CacheEntry(target, version, size, time.time())
        return model_dir

    def remove(self, target: str) -> None:
        with self._lock:
            self.entries.pop(target, None)
        shutil.rmtree(self.root / target_hash(target), ignore_errors=True)

    def evict(self, in_use: set[str], max_bytes: int | None = None) -> list[str]:
        """Remove least recently used entries not `in_use` until the cache fits `max_bytes` (the cache's bound unless
        given: 0 removes every entry not in use); the targets removed."""
        bound = self.max_bytes if max_bytes is None else max_bytes
        evicted = []
        with self._lock:
            total = sum(e.bytes for e in self.entries.values())
            for entry in sorted(self.entries.values(), key=lambda e: e.last_used):
                if total <= bound:
                    break
                if entry.target in in_use:
                    continue
                total -= entry.bytes
                evicted.append(entry.target)
                del self.entries[entry.target]
        for target in evicted:
            shutil.rmtree(self.root / target_hash(target), ignore_errors=True)
        return evicted


@dataclass(frozen=True)
class Prepared:
    """A target's tarball at one version, extracted and ready for Triton to load."""

    target: str
    version: str
    model_dir: Path


def serve_without_foreign_environments(model_dir: Path, report, python: str | None) -> list[str]:
    """The local stub runs one Python: a model whose packed environment is for another (the default tarball's is
    for the SageMaker container's) runs with this interpreter's packages instead — `report` (the tarball's
    `check`) has verified the environment's Python and contents against the tarball's own target. Edits the
    extracted copy only; says what it did, one line per model."""
    from tritonpack.backends import ENV_PARAMETER
    from tritonpack.check.structure import env_member
    from tritonpack.spec import render_config

    said = []
    for folder, config in sorted(report.configs.items()):
        if python is None or ENV_PARAMETER not in config.parameters:
            continue
        env = report.envs.get(env_member(folder, config.parameters[ENV_PARAMETER].string_value))
        if env is not None and env.python != python:
            del config.parameters[ENV_PARAMETER]
            (model_dir / folder / "config.pbtxt").write_text(render_config(config))
            said.append(f"{config.name}: its packed environment is for Python {env.python}, the local stub runs "
                        f"{python}: served with this interpreter's packages instead (--container-python "
                        f"{env.python} serves it from its environment)")
    return said


class TargetStore:
    """Makes each target's extracted folder once per tarball version. A tarball `tritonpack check` refuses gets the
    same answer until it changes (its size, mtime or ETag); one Triton would not load, until it changes or for the
    time the refusal names (a load may fail for a cause that passes)."""

    def __init__(self, source, cache: DiskCache, metrics: Metrics | None = None, python: str | None = None,
                 limits=None, container: bool = False):
        from tritonpack.check.tree import KnownEnvs

        self.source, self.cache, self.limits = source, cache, limits
        self.metrics = metrics or Metrics()
        self.python = python  # the local stub's Python: a packed env for another Python cannot run here
        # the stub runs the container's Python (`containers.ContainerPython`): a tarball is judged for that stub
        self.container = container
        self._lock = threading.Lock()
        self._target_locks: dict[str, threading.Lock] = {}
        self._refused: dict[str, tuple[str, TargetError, float]] = {}  # target → (version, answer, until)
        self.known_envs = KnownEnvs()  # the packed environments `check` found clean, inflated once each

    def prepare(self, target: str, in_use: Callable[[], Iterable[str]]) -> Prepared:
        """`target`'s extracted folder at its current version; `in_use()` names the targets Triton holds, whose
        folders stay when a full disk makes the cache remove the others."""
        version = self.source.version(target)
        if version is None:
            raise TargetError(404, f"target model {target!r} not found at {self.source.location(target)}")
        with self._lock:
            target_lock = self._target_locks.setdefault(target, threading.Lock())
        with target_lock:  # concurrent first calls: one admits, the others find it in the cache
            if (refused := self._refusal(target, version)) is not None:
                raise refused
            model_dir = self.cache.lookup(target, version) or self._admit(target, version, in_use)
        return Prepared(target, version, model_dir)

    def refusal(self, prepared: Prepared) -> TargetError | None:
        """The error Triton's refusal of `prepared` left (a call before this one tried it), or None. Takes no lock:
        the slot table asks while holding its own, which `prepare` takes inside this store's."""
        return self._refusal(prepared.target, prepared.version)

    def _refusal(self, target: str, version: str) -> TargetError | None:
        refused = self._refused.get(target)
        if refused is None or refused[0] != version or time.monotonic() >= refused[2]:
            return None
        return refused[1]

    def refuse(self, prepared: Prepared, error: TargetError, for_s: float = math.inf) -> None:
        """Answer `error` for `prepared` until the tarball changes or `for_s` seconds have passed."""
        self._refused[prepared.target] = (prepared.version, error, time.monotonic() + for_s)
        self.cache.remove(prepared.target)

    def _admit(self, target: str, version: str, in_use: Callable[[], Iterable[str]]) -> Path:
        staging = self.cache.staging_dir(target)
        unpacked = Path(tempfile.mkdtemp(dir=staging)) / "model"  # beside a download of any name
        try:
            started = time.monotonic()
            tarball = self._with_room(target, in_use, "downloading", lambda: self._fetch(target, staging))
            fetched = time.monotonic()
            self.metrics.observe("ModelDownloadingTime", fetched - started)
            report = self._with_room(target, in_use, "unpacking", lambda: self._check(tarball, unpacked))
            checked = time.monotonic()
            self.metrics.observe("ModelCheckingTime", checked - fetched)
            problems = report.problems
            if problems:
                error = TargetError(400, f"{target} is not deployable", [str(p) for p in problems])
                self._refused[target] = (version, error, math.inf)
                raise error
            model_dir = self._with_room(target, in_use, "placing",
                                        lambda: self.cache.place(target, version, unpacked))
            placed = time.monotonic()
            self.metrics.observe("ModelExtractingTime", placed - checked)
            log.info("%s: fetched in %.2f s, checked and unpacked in %.2f s, placed in %.3f s", target,
                     fetched - started, checked - fetched, placed - checked)
            for skipped in serve_without_foreign_environments(model_dir, report, self.python):
                log.warning("%s: %s", target, skipped)
            return model_dir
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _check(self, tarball: Path, unpacked: Path):
        """`check`'s report of `tarball`, its members written to `unpacked` (a new folder) by the same read."""
        from tritonpack.check import check
        from tritonpack.check.structure import container_stub_python
        from tritonpack.server import local_server_python

        shutil.rmtree(unpacked, ignore_errors=True)  # what a try cut short by a full disk wrote
        if self.container:  # judged for the stub of the container's Python, which this server runs
            return check(tarball, self.limits, python=self.python, server=container_stub_python(self.python),
                         known_envs=self.known_envs, unpack_to=unpacked)
        # for the container the tarball was built for (its manifest), by a server whose Python is this interpreter's:
        # python models may use its packages where the tarball carries no environment
        return check(tarball, self.limits, server=local_server_python(), known_envs=self.known_envs,
                     unpack_to=unpacked)

    def _fetch(self, target: str, staging: Path) -> Path:
        try:
            return self.source.fetch(target, staging)
        except Exception as e:  # noqa: BLE001 - any fetch failure but a full disk is the source's answer
            if disk_full(e):
                raise
            raise unreachable(self.source.location(target), e) from e

    def _with_room(self, target: str, in_use: Callable[[], Iterable[str]], doing: str, write: Callable[[], T]) -> T:
        """`write()`; on a full disk, once more after removing every extracted target Triton does not hold (as
        SageMaker frees an instance's volume), then 507 — never remembered as the tarball's fault."""
        written = _unless_disk_full(write)
        if written is None and self.evict({*in_use(), target}, full_disk=True):
            written = _unless_disk_full(write)
        if written is None:
            free_mb = shutil.disk_usage(self.cache.root).free / 1e6
            raise TargetError(INSUFFICIENT_STORAGE, f"no space left on the device of the disk cache {self.cache.root} "
                                                    f"{doing} {target} ({free_mb:.0f} MB free; only targets loaded in "
                                                    f"Triton are left there): free disk space or start the MME with "
                                                    f"--cache-dir on a larger disk")
        return written

    def evict(self, keep: set[str], full_disk: bool = False) -> list[str]:
        """Remove extracted targets not in `keep`, least recently used first, until the cache is within
        `--cache-bytes`, or every one of them where the disk is full; the targets removed."""
        evicted = self.cache.evict(keep, max_bytes=0 if full_disk else None)
        if evicted:
            self.metrics.inc("ModelDiskEvictions", len(evicted))
            why = "disk full" if full_disk else f"disk cache over {self.cache.max_bytes} bytes"
            log.log(logging.WARNING if full_disk else logging.INFO, "%s: removed %s", why, ", ".join(evicted))
        return evicted


def _unless_disk_full(write: Callable[[], T]) -> T | None:
    try:
        return write()
    except OSError as e:
        if disk_full(e):
            return None
        raise
