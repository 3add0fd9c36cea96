"""TorchScript files whose bytes depend on the model alone (`save`), for the exports that write `model.pt`, the
devices a module's graph fixes (`fixed_devices`), which the export and `check --deep` refuse, and a quiet trace
(`quiet_tracing`)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEBUG_SUFFIX = ".debug_pkl"
SERIALIZATION_ID = "/.data/serialization_id"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
ALIGNMENT = 64  # torch starts each member's data on this boundary (padding in the local header's extra field)
LOCAL_HEADER = 30  # bytes before a member's name in its local header


def save(module, path: Path) -> Path:
    """`module.save(path)`, then its zip rewritten without the `*.debug_pkl` members, which hold the absolute paths
    of the traced sources and the Python stack of whoever traced it (a caller one function deeper got other bytes);
    entries stay in their order, at a fixed time, aligned as torch aligns them. The serialization id, torch's
    checksum over every member the debug ones included, becomes one over the members kept. A loaded model then
    names no source lines in its errors, which its users never had anyway."""
    path = Path(path)
    module.save(str(path))
    rewritten = path.with_name(f".{path.name}.rewritten")
    try:
        with zipfile.ZipFile(path) as saved, open(rewritten, "wb") as raw, zipfile.ZipFile(raw, "w") as out:
            kept = [info for info in saved.infolist() if not info.filename.endswith(DEBUG_SUFFIX)]
            for info in kept:
                entry = zipfile.ZipInfo(info.filename, date_time=FIXED_TIME)
                entry.compress_type, entry.file_size = info.compress_type, info.file_size  # the size picks zip64
                entry.extra = _padding(raw.tell() + LOCAL_HEADER + len(info.filename.encode()))
                if info.filename.endswith(SERIALIZATION_ID):
                    out.writestr(entry, _content_id(kept))
                    continue
                with saved.open(info) as source, out.open(entry, "w") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
        os.replace(rewritten, path)
    finally:
        rewritten.unlink(missing_ok=True)
    return path


@contextmanager
def quiet_tracing() -> Iterator[None]:
    """No warnings and no transformers notices while a model is traced or exported: the tracer reads every attribute
    of the module, which sets off transformers' deprecation warnings and its loss-type notice, and it warns about
    Python-level shape logic. None of it is about the user's model; each export's numeric check after it decides."""
    transformers_log = logging.getLogger("transformers")
    level = transformers_log.level
    transformers_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers_log.setLevel(level)


def fixed_devices(module) -> list[str]:
    """The devices a TorchScript module's graph names as constants: it moves tensors there whatever device its
    inputs and weights are on (a trace records the device it ran on, e.g. where transformers builds a mask)."""
    return sorted({line.split('value="')[1].split('"')[0] for line in str(module.inlined_graph).splitlines()
                   if ": Device = prim::Constant[value=" in line})


def _padding(data_offset_without_extra: int) -> bytes:
    """An extra field (id `FB`, as torch writes) that moves the member's data to the next `ALIGNMENT` boundary."""
    size = -(data_offset_without_extra + 4) % ALIGNMENT
    return b"FB" + struct.pack("<H", size) + b"Z" * size


def _content_id(members: list[zipfile.ZipInfo]) -> str:
    """40 decimal digits, as torch's id, from the kept members' names, sizes and CRCs."""
    digest = hashlib.sha256()
    for info in members:
        if not info.filename.endswith(SERIALIZATION_ID):
            digest.update(f"{info.filename}:{info.file_size}:{info.CRC}\n".encode())
    return f"{int(digest.hexdigest(), 16) % 10**40:040d}"
