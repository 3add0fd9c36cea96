"""Content-addressed cache for slow build steps (exports, compiled pipelines)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def fingerprint(source: Path, settings: dict) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    files = sorted(p for p in Path(source).rglob("*") if p.is_file()) if Path(source).is_dir() else [Path(source)]
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(source) if path != source else path.name}:{stat.st_size}".encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def cached_dir(cache: Path, kind: str, source: Path, settings: dict, produce: Callable[[Path], None]) -> Path:
    """`cache/kind-<fingerprint>`, produced once into a staging folder and renamed into place."""
    target = Path(cache) / f"{kind}-{fingerprint(source, settings)}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        produce(staging)
        staging.rename(target)
    except FileExistsError:
        shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
