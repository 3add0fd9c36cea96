"""What `check` knows about a repository, read from a folder or from a tarball's stream in one pass.

A tarball is never extracted to the user's folders: configs, manifests and model sources are kept in memory,
every file is hashed, packed environments are inspected inside the stream. `extract_members` writes chosen
members (the artifacts `--deep` opens) into a folder the caller owns, a temporary one; `read_tarball(unpack_to=)`
writes every member there while the same read checks it (the local MME's gateway).
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from tritonpack.archive import ArchiveLimits, Problem, Unpacker, normalise_name, scan

ENV_SUFFIXES = (".tar.gz", ".tgz", ".tar")
TEXT_LIMIT = 4 << 20  # configs, manifests and model sources are small; larger ones are not read into memory
SPOOLED_ENV_BYTES = 64 << 20  # KnownEnvs holds a packed environment's bytes in memory up to this, on disk beyond
# A version folder: Triton ignores a name with leading zeros (01/) and one that is no ASCII number (²/)
_VERSION_FOLDER = re.compile(r"0|[1-9][0-9]*")


def is_version_folder(name: str) -> bool:
    return _VERSION_FOLDER.fullmatch(name) is not None


@dataclass
class EnvInfo:
    python: str | None
    problems: list[Problem]
    modules: frozenset[str] = frozenset()  # top-level importable names in its site-packages
    distributions: dict[str, str] = field(default_factory=dict)  # installed distribution → version
    system_site_packages: bool = False  # pyvenv.cfg: the base interpreter's packages are importable too


@dataclass
class Tree:
    """What the checks need to know about a repository, read from a folder or a tar stream."""

    files: dict[str, int] = field(default_factory=dict)  # relative path → size
    dirs: set[str] = field(default_factory=set)
    texts: dict[str, bytes] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)
    envs: dict[str, EnvInfo] = field(default_factory=dict)

    def add_file(self, name: str, size: int) -> None:
        self.files[name] = size
        self.add_dir(posixpath.dirname(name))

    def add_dir(self, name: str) -> None:
        while name:
            self.dirs.add(name)
            name = posixpath.dirname(name)

    def children(self, folder: str) -> tuple[list[str], list[str]]:
        """(sub-folder names, file names) directly inside `folder` ("" for the top)."""
        prefix = f"{folder}/" if folder else ""
        subdirs = sorted({d[len(prefix):] for d in self.dirs if d.startswith(prefix) and "/" not in d[len(prefix):]})
        files = sorted(f[len(prefix):] for f in self.files if f.startswith(prefix) and "/" not in f[len(prefix):])
        return subdirs, files

    def exists(self, name: str) -> bool:
        return name in self.files or name in self.dirs


class _Hashing(io.RawIOBase):
    def __init__(self, f):
        self.f, self.digest = f, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read(len(b))
        b[:len(data)] = data
        self.digest.update(data)
        return len(data)

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        return self.digest.hexdigest()


_PYVENV_VERSION = re.compile(r"^\s*version(?:_info)?\s*=\s*(\d+)\.(\d+)", re.MULTILINE)
_PYVENV_SYSTEM_SITE = re.compile(r"^\s*include-system-site-packages\s*=\s*true\s*$", re.MULTILINE | re.IGNORECASE)
_CONDA_PYTHON = re.compile(r"^conda-meta/python-(\d+)\.(\d+)\.[^/]*\.json$")
_LIB_PYTHON = re.compile(r"^lib/python(\d+)\.(\d+)(/|$)")
# A top-level importable name in site-packages: a package folder, a module (source or bytecode), or an extension
# module.
_SITE_MODULE = re.compile(r"^lib/python\d+\.\d+/site-packages/([A-Za-z_][A-Za-z0-9_]*)(/|\.pyc?$|\.cpython-[^/]*\.so$)")
_DIST_INFO = re.compile(r"^lib/python\d+\.\d+/site-packages/([A-Za-z0-9_.]+?)-([0-9][^/-]*)\.dist-info(/|$)")


def inspect_env(fileobj, label: str, limits: ArchiveLimits) -> EnvInfo:
    """The Python version a packed environment (conda-pack or venv-pack tarball) was built for, what it installs
    (top-level modules, and distributions by their `.dist-info` folders), and its safety.

    Python version sources, best first: `conda-meta/python-X.Y.Z-*.json` (conda-pack), `pyvenv.cfg` (venv-pack), the
    `lib/pythonX.Y/` folder name (both).
    """
    found: dict[str, str] = {}
    modules: set[str] = set()
    distributions: dict[str, str] = {}
    system_site = False

    def visit(member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        nonlocal system_site
        name = normalise_name(member.name)
        if m := _CONDA_PYTHON.match(name):
            found.setdefault("conda", f"{m[1]}.{m[2]}")
        elif name == "pyvenv.cfg" and member.isfile() and member.size < 65536:
            cfg = tar.extractfile(member).read().decode("utf-8", "replace")
            if m := _PYVENV_VERSION.search(cfg):
                found.setdefault("pyvenv", f"{m[1]}.{m[2]}")
            system_site = bool(_PYVENV_SYSTEM_SITE.search(cfg))
        elif m := _LIB_PYTHON.match(name):
            found.setdefault("lib", f"{m[1]}.{m[2]}")
        if m := _SITE_MODULE.match(name):
            modules.add(m[1])
        elif m := _DIST_INFO.match(name):
            distributions[m[1].lower().replace("_", "-")] = m[2]

    problems = [Problem(p.file if p.file == label else f"{label}:{p.file}", p.field, p.reason)
                for p in scan(fileobj, label, limits, visit, links_out=True)]
    python = found.get("conda") or found.get("pyvenv") or found.get("lib")
    return EnvInfo(python, problems, frozenset(modules), distributions, system_site)


class KnownEnvs:
    """Packed environments already inspected and found clean, by the SHA-256 of their bytes and the limits they were
    read under. A gateway that checks many tarballs carrying one environment (every fine-tune built with it) inflates
    it once: a member with known bytes is hashed, not inflated again (docs/performance.md, sixty-sixth round). An
    environment with problems is never kept, so each tarball carrying it is told them with its own names."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._by_key: dict[tuple[str, ArchiveLimits], EnvInfo] = {}
        self._lock = threading.Lock()
        self.inspected = 0  # environments inflated, not found known

    def inspect(self, member: _Hashing, label: str, limits: ArchiveLimits) -> tuple[EnvInfo, str]:
        """(what `member`'s environment is, its SHA-256), inflating it only when its bytes are not known."""
        with self._lock:
            recognisable = any(read_under == limits for _, read_under in self._by_key)
        if recognisable:  # its bytes are kept while they are hashed, to be inflated only if they are new
            with tempfile.SpooledTemporaryFile(SPOOLED_ENV_BYTES) as copy:
                while chunk := member.read(1 << 20):
                    copy.write(chunk)
                digest = member.digest.hexdigest()
                with self._lock:
                    known = self._by_key.get((digest, limits))
                if known is not None:
                    return known, digest
                copy.seek(0)
                info = inspect_env(copy, label, limits)
        else:  # nothing to recognise it by: inflated as it streams in, as without known environments
            info = inspect_env(member, label, limits)
            digest = member.drain()
        with self._lock:
            self.inspected += 1
            if not info.problems:
                self._by_key[(digest, limits)] = info
                while len(self._by_key) > self.capacity:
                    del self._by_key[next(iter(self._by_key))]  # the oldest
        return info, digest


def _keep_text(name: str, size: int) -> bool:
    base = posixpath.basename(name)
    return size <= TEXT_LIMIT and (base in ("config.pbtxt", "manifest.json") or base.endswith(".py"))


def _read_member(tree: Tree, name: str, size: int, f, limits: ArchiveLimits, known_envs: KnownEnvs | None) -> None:
    tree.add_file(name, size)
    reader = _Hashing(f)
    if _keep_text(name, size):
        tree.texts[name] = reader.read()
    elif name.endswith(ENV_SUFFIXES) and known_envs is not None:
        tree.envs[name], tree.sha256[name] = known_envs.inspect(reader, name, limits)
        return
    elif name.endswith(ENV_SUFFIXES):
        tree.envs[name] = inspect_env(reader, name, limits)
    tree.sha256[name] = reader.drain()


def read_tarball(path: Path, limits: ArchiveLimits, known_envs: KnownEnvs | None = None,
                 unpack_to: Path | None = None) -> tuple[Tree, list[Problem]]:
    """What `path` holds and its problems; with `unpack_to` (a folder not yet there) its members are also written
    there as they are read, whatever the verdict: the caller removes the folder unless there is no problem."""
    tree = Tree()
    unpacker = Unpacker(unpack_to) if unpack_to is not None else None

    def visit(member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        name = normalise_name(member.name)
        if not name:
            return
        if member.isdir():
            tree.add_dir(name)
            if unpacker is not None:
                unpacker.folder(member)
        elif member.isfile():
            data = tar.extractfile(member)
            with nullcontext(data) if unpacker is None else unpacker.file(member, data) as data:
                _read_member(tree, name, member.size, data, limits, known_envs)
        else:
            tree.add_file(name, member.size)

    with open(path, "rb") as f:
        problems = scan(f, Path(path).name, limits, visit)
    return tree, problems


def read_folder(path: Path, limits: ArchiveLimits) -> tuple[Tree, list[Problem]]:
    tree, problems = Tree(), []
    root = Path(path)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath).relative_to(root).as_posix()
        base = "" if base == "." else base
        for d in list(dirnames):
            rel = posixpath.join(base, d) if base else d
            if (Path(dirpath) / d).is_symlink():
                problems.append(Problem(rel, "path", "a link; MME tarballs carry no links"))
                dirnames.remove(d)
            else:
                tree.dirs.add(rel)
        for filename in sorted(filenames):
            full = Path(dirpath) / filename
            rel = posixpath.join(base, filename) if base else filename
            if full.is_symlink():
                problems.append(Problem(rel, "path", "a link; MME tarballs carry no links"))
                continue
            if not full.is_file():
                problems.append(Problem(rel, "type", "not a regular file"))
                continue
            with open(full, "rb") as f:
                _read_member(tree, rel, full.stat().st_size, f, limits, None)
    return tree, problems


def extract_members(tarball: Path, dest: Path, wanted: Callable[[str], bool], limits: ArchiveLimits) -> list[Problem]:
    """Write the regular files of `tarball` whose normalised names `wanted` accepts under `dest`, in one pass.

    Only members the archive scan found safe are visited; a name is written only if it resolves inside `dest`.
    The caller owns `dest` (a temporary folder): nothing else is written."""
    dest = Path(dest).resolve()

    def visit(member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        name = normalise_name(member.name)
        if not (member.isfile() and name and wanted(name)):
            return
        target = (dest / name).resolve()
        if not target.is_relative_to(dest):
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            shutil.copyfileobj(tar.extractfile(member), out, 1 << 20)

    with open(tarball, "rb") as f:
        return scan(f, Path(tarball).name, limits, visit)
