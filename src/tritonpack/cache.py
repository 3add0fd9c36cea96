"""One content-addressed cache for every slow build step: exports, fused and packed graphs, precision checks,
TensorRT plans, serialized DALI pipelines.

A step is a `Producer`: a function that writes its artifact into a folder. `ArtifactCache.get(producer, **inputs)`
returns `<cache>/<kind>-<key>/`, producing it once. The key covers everything the output depends on: the inputs
(files and folders by content, other values by value), the producer's own source file and the files it names in
`code`, the versions of the libraries it names, and what `environment()` reports about the machine (a TensorRT plan
is specific to the GPU's compute capability and the TensorRT version).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

KEY_LENGTH = 16


@dataclass(frozen=True)
class Producer:
    kind: str
    produce: Callable[..., None]  # produce(out_dir: Path, **inputs) writes the artifact's files into out_dir
    libraries: tuple[str, ...] = ()  # distributions whose versions the output depends on (absent ones count too)
    code: tuple[Path, ...] = ()  # files besides the producer's own module that shape the output
    environment: Callable[[], Mapping[str, object]] | None = None  # machine facts the output depends on

    def __call__(self, out_dir: Path, **inputs) -> None:
        self.produce(out_dir, **inputs)


def producer(kind: str, libraries: tuple[str, ...] = (), code: tuple[Path, ...] = (),
             environment: Callable[[], Mapping[str, object]] | None = None):
    """Decorator: `@producer("text-encoder-onnx", libraries=("torch", "onnx"))` over `def f(out_dir, **inputs)`."""
    def wrap(function: Callable[..., None]) -> Producer:
        return Producer(kind, function, tuple(libraries), tuple(Path(p) for p in code), environment)
    return wrap


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # e.g. tensorflow installed as tensorflow-cpu: list both names
        return None


class ArtifactCache:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._digests: dict[tuple[str, int, int], str] = {}

    def get(self, step: Producer, **inputs) -> Path:
        """The folder `step` writes for `inputs`, produced once (into a staging folder renamed into place)."""
        target = self.root / f"{step.kind}-{self.key(step, inputs)}"
        if target.is_dir():
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=self.root))
        try:
            step(staging, **inputs)
            staging.rename(target)
        except BaseException as e:
            shutil.rmtree(staging, ignore_errors=True)  # a failed step (a full disk included) leaves nothing
            if isinstance(e, OSError) and target.is_dir():
                return target  # another process finished the same artifact first
            raise
        return target

    def key(self, step: Producer, inputs: Mapping[str, object]) -> str:
        environment = dict(step.environment()) if step.environment else {}  # may raise: a tool is missing
        record = {
            "kind": step.kind,
            "code": [self._digest(Path(inspect.getsourcefile(step.produce)))] + [self._digest(p) for p in step.code],
            "libraries": {name: _version(name) for name in step.libraries},
            "environment": environment,
            "inputs": {name: self._value(value) for name, value in sorted(inputs.items())},
        }
        return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:KEY_LENGTH]

    def _value(self, value):
        if isinstance(value, Path):
            return {"content": self._digest(value)}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: self._value(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {str(k): self._value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._value(v) for v in value]
        return value

    def _digest(self, path: Path) -> str:
        """A file's content hash, or a folder's (names and contents); remembered per path, size and mtime."""
        path = Path(path).resolve()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        digest = hashlib.sha256()
        for file in files:
            stat = file.stat()
            memo = (str(file), stat.st_size, stat.st_mtime_ns)
            if memo not in self._digests:
                content = hashlib.sha256()
                with open(file, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        content.update(chunk)
                self._digests[memo] = content.hexdigest()
            name = file.relative_to(path).as_posix() if file != path else ""
            digest.update(f"{name}:{self._digests[memo]}\n".encode())
        return digest.hexdigest()
