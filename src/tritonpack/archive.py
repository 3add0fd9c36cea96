"""Tarball safety: inspect a (gzip) tar in one read, and unpack only what passes.

`scan` reads the stream once, front to back, counting decompressed bytes as they come, so
a bomb (by size, ratio or entry count) is stopped early instead of filling a disk. An `Unpacker` writes the members
a scan passes while that same read goes by (Python's `data` extraction filter as a second line of defence), into a
staging folder its caller removes unless the read found nothing.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from isal import igzip, isal_zlib  # ISA-L inflates ~3x faster than zlib: see docs/performance.md, sixth round

GIB = 1 << 30
MAX_HEADER_BYTES = 1 << 20  # a GNU long name or a member's PAX records
EXTENDED_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                    tarfile.SOLARIS_XHDTYPE)
READ_BYTES = 1 << 16  # per read, not tar's 10 KiB records: check with a packed environment 1.26 -> 0.96 s
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Problem:
    """One reason a repository or tarball will not deploy: `file: field: reason` on one line."""

    file: str
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.reason}"


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on what an archive may unpack to. Defaults fit multi-GB model tarballs, not bombs."""

    max_members: int = 20_000
    max_total_bytes: int = 64 * GIB  # decompressed, tar headers included
    max_member_bytes: int = 32 * GIB
    max_ratio: float = 200.0  # decompressed / compressed; weights and packed envs are near 1, zeros ~1000
    ratio_floor_bytes: int = 64 << 20  # tiny archives (headers, padding) compress far better; ignore below

    def __post_init__(self) -> None:
        if min(self.max_members, self.max_total_bytes, self.max_member_bytes, self.max_ratio) <= 0:
            raise ValueError("archive limits must be positive")


class _Refused(Exception):
    """The read stops here with one problem: a limit passed, or a member the unpacker will not write."""

    def __init__(self, problem: Problem):
        self.problem = problem


class UnpackFailed(OSError):
    """Writing an unpacked member failed for a cause of the disk, not of the archive (no space left, no
    permission): raised through `scan` as it is, with the errno of the write that failed."""


class _CountingRaw(io.RawIOBase):
    """The compressed file, counting bytes read."""

    def __init__(self, f):
        self.f, self.count = f, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.count += n or 0
        return n


class _Meter(io.RawIOBase):
    """The decompressed stream; stops reading once the total or the compression ratio goes past the limits."""

    def __init__(self, stream, raw: _CountingRaw | None, limits: ArchiveLimits, label: str):
        self.stream, self.raw, self.limits, self.label, self.count = stream, raw, limits, label, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            data = self.stream.read(len(b))
        except isal_zlib.error as e:  # a corrupt deflate stream: what tarfile reports for zlib's own error
            raise tarfile.ReadError(f"corrupt gzip data: {e}") from None
        n = len(data)
        b[:n] = data
        self.count += n
        limits = self.limits
        if self.count > limits.max_total_bytes:
            raise _Refused(Problem(self.label, "size", f"unpacks to more than {limits.max_total_bytes} bytes "
                                                      f"(limit max_total_bytes)"))
        if self.raw is not None and self.count > limits.ratio_floor_bytes \
                and self.count > limits.max_ratio * max(self.raw.count, 1):
            raise _Refused(Problem(self.label, "size", f"compression ratio above {limits.max_ratio:g} "
                                                      f"({self.count} bytes from {self.raw.count}; "
                                                      f"limit max_ratio)"))
        return n

    def drain(self) -> None:
        """Read a gzip stream to its end, where gzip checks its CRC and length. A plain tar has no trailer: what
        follows its end is not read (a sparse 2 GiB file stays unread)."""
        if self.raw is None:
            return
        while self.read(READ_BYTES):
            pass


def _open_stream(fileobj, limits: ArchiveLimits, label: str) -> _Meter:
    """A metered decompressed view of `fileobj` (gzip by magic number, else plain tar)."""
    raw = _CountingRaw(fileobj)
    buffered = io.BufferedReader(raw, buffer_size=READ_BYTES)
    if buffered.peek(2)[:2] == GZIP_MAGIC:
        return _Meter(igzip.IGzipFile(fileobj=buffered, mode="rb"), raw, limits, label)
    return _Meter(buffered, None, limits, label)


def normalise_name(name: str) -> str:
    """A member name as a relative POSIX path without `./` or trailing slashes ("" for the root)."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return "/".join(parts)


def _member_problems(member: tarfile.TarInfo, seen: dict[str, tarfile.TarInfo], links: set[str],
                     limits: ArchiveLimits, links_out: bool = False,
                     implied: set[str] | frozenset = frozenset()) -> list[Problem]:
    name = member.name
    problems = []
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        problems.append(Problem(name, "path", "absolute path"))
    if ".." in name.split("/"):
        problems.append(Problem(name, "path", "'..' leads outside the archive"))
    if "\x00" in name:
        problems.append(Problem(name, "path", "NUL byte in the name"))
    if problems:
        return problems
    norm = normalise_name(name)
    if not norm and not member.isdir():  # found by tests/test_archive_fuzz.py: "." as a file crashed extraction
        return [Problem(name, "path", "an entry that is not a folder names the archive's root")]
    if norm in seen:
        problems.append(Problem(name, "path", "duplicate entry (a later member would overwrite an earlier one)"))
    parent = posixpath.dirname(norm)
    while parent:
        if parent in links:
            problems.append(Problem(name, "path", f"inside {parent}, which is a link"))
            break
        if parent in seen and not seen[parent].isdir():
            problems.append(Problem(name, "path", f"inside {parent}, which is not a folder"))
            break
        parent = posixpath.dirname(parent)
    if not member.isdir() and norm in implied and norm not in seen:
        problems.append(Problem(name, "path", "not a folder, but earlier entries are inside it"))
    if member.issym():
        target = member.linkname
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(norm), target))
        if not links_out and (target.startswith("/") or resolved == ".." or resolved.startswith("../")):
            problems.append(Problem(name, "link", f"symlink to {target} leads outside the archive"))
        links.add(norm)
    elif member.islnk():
        target = member.linkname
        resolved = normalise_name(target)
        if target.startswith("/") or ".." in target.split("/"):
            problems.append(Problem(name, "link", f"hard link to {target} leads outside the archive"))
        elif target.removeprefix("./") != resolved:  # "a/", "a/.": tarfile cannot link them when streaming
            problems.append(Problem(name, "link", f"hard link to {target}, which is not a plain file name"))
        elif resolved not in seen or not seen[resolved].isfile():
            problems.append(Problem(name, "link", f"hard link to {target}, which is not an earlier file here"))
        links.add(norm)
    if not links_out and (member.issym() or member.islnk()):  # as `check` says of a folder: Triton needs none
        problems.append(Problem(name, "link", "a link; MME tarballs carry no links"))
    if member.ischr() or member.isblk():
        problems.append(Problem(name, "type", "device file"))
    elif member.isfifo():
        problems.append(Problem(name, "type", "FIFO"))
    elif not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        problems.append(Problem(name, "type", f"unsupported member type {member.type!r}"))
    elif member.sparse is not None:  # declares its unpacked size but inflates almost nothing: no ratio limit holds
        problems.append(Problem(name, "type", "sparse file"))
    if member.size > limits.max_member_bytes:
        problems.append(Problem(name, "size", f"{member.size} bytes is above the {limits.max_member_bytes} "
                                              f"byte limit (max_member_bytes)"))
    return problems


Visitor = Callable[[tarfile.TarInfo, tarfile.TarFile], None]


class _BoundedHeaders(tarfile.TarInfo):
    """A member whose long name or PAX records (which tarfile reads whole into memory before the member is seen)
    stay under MAX_HEADER_BYTES: a 2 MB tar.gz held a 200 MiB name."""

    def _proc_member(self, tar):
        if self.type in EXTENDED_HEADERS and self.size > MAX_HEADER_BYTES:
            raise tarfile.ReadError(f"an extended header of {self.size} bytes (names and PAX records are under "
                                    f"{MAX_HEADER_BYTES})")
        return super()._proc_member(tar)


def _members(fileobj, limits: ArchiveLimits, label: str) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    """The members of the tar stream in `fileobj` in order, each with its archive (to read the member's data while
    the stream is there). After the last one the rest of the stream is drained: tar stops at its end-of-archive
    blocks, before gzip's trailer, and a damaged member can inflate to wrong bytes without any other error. A caller
    that stops early reads no further."""
    stream = _open_stream(fileobj, limits, label)
    with tarfile.open(fileobj=stream, mode="r|", bufsize=READ_BYTES, tarinfo=_BoundedHeaders) as tar:
        for member in tar:
            yield member, tar
        # tarfile ends the archive at a damaged header as at the first end-of-archive block; GNU tar skips a damaged
        # header and extracts what follows, over members checked here, and `tar -i` extracts a second archive after
        # the first: what follows must be zeros, in a tar.gz all of it (read anyway, for gzip's CRC), in a plain tar
        # the block after the one tarfile stopped at (a sparse 2 GiB file stays unread)
        rest = tar.fileobj  # tarfile's read-ahead, then the stream
        while chunk := rest.read(READ_BYTES if stream.raw is not None else tarfile.BLOCKSIZE):
            if chunk.strip(b"\0"):
                raise tarfile.ReadError("data after the end of the archive (a damaged header or a second archive "
                                        "hides members)")
            if stream.raw is None:
                break
    stream.drain()


def scan(fileobj, label: str, limits: ArchiveLimits, visit: Visitor | None = None,
         links_out: bool = False) -> list[Problem]:
    """Problems of the tar stream in `fileobj`, read once; `visit(member, tar)` sees each safe member in order
    (it may read the member's data with `tar.extractfile(member)` while the stream is there).

    `links_out`: symlinks may point outside (a packed env's `bin/python` → the server's interpreter); members
    inside a link, absolute or `..` names and hard links out are refused all the same."""
    problems: list[Problem] = []
    seen: dict[str, tarfile.TarInfo] = {}
    links: set[str] = set()
    implied: set[str] = set()  # folders that earlier entries' paths imply
    declared = 0
    try:
        for count, (member, tar) in enumerate(_members(fileobj, limits, label), start=1):
            if count > limits.max_members:
                problems.append(Problem(label, "members", f"more than {limits.max_members} entries "
                                                          f"(limit max_members)"))
                break
            declared += member.size
            if declared > limits.max_total_bytes:
                problems.append(Problem(label, "size", f"members declare more than {limits.max_total_bytes} "
                                                       f"bytes (limit max_total_bytes)"))
                break
            member_problems = _member_problems(member, seen, links, limits, links_out, implied)
            problems += member_problems
            norm = normalise_name(member.name)
            seen.setdefault(norm, member)
            parent = posixpath.dirname(norm)
            while parent and parent not in implied:
                implied.add(parent)
                parent = posixpath.dirname(parent)
            if visit is not None and not member_problems:
                visit(member, tar)
    except _Refused as e:
        problems.append(e.problem)
    except UnpackFailed:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        problems.append(Problem(label, "archive", _unreadable(e, fileobj)))
    return problems


def _unreadable(e: Exception, fileobj) -> str:
    """The reason a tar or tar.gz could not be read. ISA-L's gzip says the same for a stream cut short and for bytes
    appended after it; a seekable file is inflated again, member by member, to say which."""
    if isinstance(e, EOFError) and fileobj.seekable():
        try:
            return f"not a readable tar.gz: {_where_gzip_ends(fileobj)}"
        except (isal_zlib.error, OSError):  # a header ISA-L's gzip reader took for a cut
            pass
    return f"not a readable tar or tar.gz: {e}"


def _where_gzip_ends(f) -> str:
    size = f.seek(0, io.SEEK_END)
    f.seek(0)
    inflate, offset, data = isal_zlib.decompressobj(31), 0, b""  # 31: gzip's header and trailer
    while data or (data := f.read(READ_BYTES)):
        if inflate.eof:  # a member ended: what follows must be another
            if data[:2] != GZIP_MAGIC:
                return (f"the last {size - offset} bytes follow the end of its gzip data and are not gzip (a file "
                        f"appended to, or two files joined): build or download the tarball again")
            inflate = isal_zlib.decompressobj(31)
        inflate.decompress(data)
        offset += len(data)
        data = inflate.unused_data if inflate.eof else b""
        offset -= len(data)
    return "its gzip data ends before the end-of-stream marker (a download or copy cut short): build or download " \
           "the tarball again"


class _Tee(io.RawIOBase):
    """A member's bytes as they are read, each also written to `out`."""

    def __init__(self, data, out, name: str):
        self.data, self.out, self.name = data, out, name

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.data.readinto(b)
        try:
            self.out.write(memoryview(b)[:n])
        except OSError as e:
            raise UnpackFailed(e.errno, f"cannot write {self.name}: {e.strerror}") from e
        return n


class Unpacker:
    """Writes the members a `scan` passes (folders and regular files) under `root` while the scan reads them, so one
    read of a tarball both checks and unpacks it (docs/performance.md, sixty-seventh round; before, the second
    read of an extraction after the check cost 0.3-0.4 s of each MME load). A name is written only where it
    resolves inside `root`, with the mode Python's `data` extraction filter gives it, and only once. Everything is
    written before the whole archive is judged: `root` is a staging folder of the caller's, removed unless the read
    found no problem; a failure to write that is the disk's raises `UnpackFailed`."""

    def __init__(self, root: Path):
        Path(root).mkdir(parents=True)
        self._real_root = Path(root).resolve()

    def _target(self, member: tarfile.TarInfo) -> tuple[Path, tarfile.TarInfo]:
        try:
            filtered = tarfile.data_filter(member, str(self._real_root))
        except tarfile.FilterError as e:  # the scan's own rules refuse all of these first
            raise _Refused(Problem(member.name, "path", str(e))) from None
        target = self._real_root / normalise_name(member.name)
        if not target.resolve().is_relative_to(self._real_root):
            raise _Refused(Problem(member.name, "path", "resolves outside the folder it is unpacked into"))
        return target, filtered

    def folder(self, member: tarfile.TarInfo) -> None:
        target, _ = self._target(member)
        with self._writing(member):
            target.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def file(self, member: tarfile.TarInfo, data) -> Iterator[io.RawIOBase]:
        """`data` (what `tar.extractfile(member)` reads) as it is read, written to the member's file; the caller
        reads it to its end."""
        target, filtered = self._target(member)
        with self._writing(member):
            target.parent.mkdir(parents=True, exist_ok=True)
            # "x": a second member of one name is a collision the scan refuses first; closed by the `with` below
            out = open(target, "xb")  # noqa: SIM115
        with out:
            yield _Tee(data, out, member.name)
        os.chmod(target, filtered.mode)

    @contextmanager
    def _writing(self, member: tarfile.TarInfo) -> Iterator[None]:
        try:
            yield
        except (IsADirectoryError, NotADirectoryError, FileExistsError) as e:  # a file over an implied folder
            raise _Refused(Problem(member.name, "path", f"entries collide: {e.strerror}")) from None
        except OSError as e:
            raise UnpackFailed(e.errno, f"cannot write {member.name}: {e.strerror}") from e
