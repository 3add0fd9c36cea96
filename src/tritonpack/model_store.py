"""Where a local MME gets its tarballs (a folder or an S3 prefix) and the disk cache it extracts them into.

The cache mirrors the SageMaker Triton container's layout: each target is extracted to `<cache>/<hash>/model`,
the only url shape Triton 2.73's SageMaker front-end accepts, with `<hash>` derived from the target name.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tritonpack.errors import TritonpackError

MAX_TARGET_LENGTH = 1024  # SageMaker's limit on TargetModel


class TargetError(TritonpackError):
    """The target cannot be served: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, problems: list | None = None):
        super().__init__(message)
        self.status, self.message, self.problems = status, message, list(problems or [])


def validate_target(target: str | None) -> str:
    """A target is a relative key under the models prefix, as SageMaker's TargetModel is."""
    if not target:
        raise TargetError(400, "missing X-Amzn-SageMaker-Target-Model header: a multi-model endpoint needs "
                               "the name of the tarball to invoke")
    path = PurePosixPath(target)
    if len(target) > MAX_TARGET_LENGTH or path.is_absolute() or ".." in path.parts or "\x00" in target \
            or target.endswith("/"):
        raise TargetError(400, f"invalid target model {target!r}: expected a relative key such as "
                               f"'model.tar.gz' (no '..', no leading '/', at most {MAX_TARGET_LENGTH} characters)")
    return target


def target_hash(target: str) -> str:
    return hashlib.sha256(target.encode()).hexdigest()[:32]


class LocalSource:
    """Tarballs in a folder; a target is a path relative to it."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"--models {root}: no such folder")

    def __str__(self) -> str:
        return str(self.root)

    def _path(self, target: str) -> Path:
        # `validate_target` refused absolute paths and '..'; links the owner put in the folder are followed.
        return self.root / validate_target(target)

    def version(self, target: str) -> str | None:
        """A string that changes when the tarball changes; None when there is no such tarball."""
        path = self._path(target)
        try:
            stat = path.stat()
        except OSError:
            return None
        return f"{stat.st_size}-{stat.st_mtime_ns}" if path.is_file() else None

    def fetch(self, target: str, dest: Path) -> None:
        shutil.copyfile(self._path(target), dest)

    def location(self, target: str) -> str:
        return str(self.root / target)


class S3Source:
    """Tarballs under `s3://bucket/prefix/`, read with boto3 (`endpoint_url` for S3-compatible stores, moto)."""

    def __init__(self, url: str, endpoint_url: str | None = None, client=None):
        import boto3

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not url.startswith("s3://") or not bucket:
            raise ValueError(f"expected s3://bucket/prefix, got {url!r}")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, target: str) -> str:
        return f"{self.prefix}/{target}" if self.prefix else target

    def version(self, target: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(target))
        except ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (403, 404):
                return None
            raise
        return f"{head.get('ContentLength')}-{head.get('ETag', '').strip(chr(34))}"

    def fetch(self, target: str, dest: Path) -> None:
        self.client.download_file(self.bucket, self.key(target), str(dest))

    def location(self, target: str) -> str:
        return f"s3://{self.bucket}/{self.key(target)}"


def open_source(models: str, endpoint_url: str | None = None):
    return S3Source(models, endpoint_url) if str(models).startswith("s3://") else LocalSource(Path(models))


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
    run are found again at start-up (`<hash>/source.json` names their target and version).
    """

    def __init__(self, root: Path, max_bytes: int):
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.entries: dict[str, CacheEntry] = {}
        for meta in self.root.glob("*/source.json"):
            try:
                data = json.loads(meta.read_text())
                entry = CacheEntry(data["target"], data["version"], int(data["bytes"]), meta.stat().st_mtime)
            except (OSError, ValueError, KeyError):
                shutil.rmtree(meta.parent, ignore_errors=True)
                continue
            if entry.hash == meta.parent.name and (meta.parent / "model").is_dir():
                self.entries[entry.target] = entry

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

    def staging_file(self, target: str) -> Path:
        """Where to download `target`: a fresh folder beside the entries (the caller removes it), keeping the
        tarball's own name so that problems found in it name it."""
        self.root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".download-{target_hash(target)[:8]}-", dir=self.root))
        return folder / PurePosixPath(target).name

    def add(self, target: str, version: str, tarball: Path, limits=None) -> Path:
        """Safely extract `tarball` to `<hash>/model` and record it; raises ArchiveError on an unsafe archive."""
        from tritonpack.archive import safe_extract

        entry_dir = self.root / target_hash(target)
        with self._lock:
            self.entries.pop(target, None)
        (entry_dir / "source.json").unlink(missing_ok=True)
        model_dir = safe_extract(tarball, entry_dir / "model", limits, replace=True)
        size = folder_bytes(model_dir)
        (entry_dir / "source.json").write_text(json.dumps({"target": target, "version": version, "bytes": size}))
        with self._lock:
            self.entries[target] = CacheEntry(target, version, size, time.time())
        return model_dir

    def remove(self, target: str) -> None:
        with self._lock:
            self.entries.pop(target, None)
        shutil.rmtree(self.root / target_hash(target), ignore_errors=True)

    def evict(self, in_use: set[str]) -> list[str]:
        """Remove least recently used entries not `in_use` until the cache fits `max_bytes`; the targets removed."""
        evicted = []
        with self._lock:
            total = sum(e.bytes for e in self.entries.values())
            for entry in sorted(self.entries.values(), key=lambda e: e.last_used):
                if total <= self.max_bytes:
                    break
                if entry.target in in_use:
                    continue
                total -= entry.bytes
                evicted.append(entry.target)
                del self.entries[entry.target]
        for target in evicted:
            shutil.rmtree(self.root / target_hash(target), ignore_errors=True)
        return evicted
