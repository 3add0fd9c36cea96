"""Archive safety fuzzing (hypothesis): generated tarballs against `archive_problems` and `tritonpack check`, which
unpacks as it reads for the local MME (`unpack_to`). Whatever the archive holds — traversal, absolute paths, links
out, device files, FIFOs, duplicate entries, bombs — nothing is ever written outside the target folder (a snapshot
of the whole sandbox proves it), what is written stays inside it and is never a link or a device, and an archive
with no archive problem is written whole.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_archive import archive_problems
from tritonpack.archive import ArchiveLimits, normalise_name
from tritonpack.check import check

EXAMPLES = int(os.environ.get("TRITONPACK_FUZZ_EXAMPLES", "60"))  # `make soak` runs many more
LIMITS = ArchiveLimits(max_members=40, max_total_bytes=1 << 20, max_member_bytes=256 << 10, max_ratio=50.0,
                       ratio_floor_bytes=64 << 10)
SEGMENTS = st.sampled_from(["a", "b", "model", "1", "..", ".", "", "config.pbtxt", "ünï", "outside", "x" * 120])
NAMES = st.one_of(
    st.lists(SEGMENTS, min_size=1, max_size=4).map("/".join),
    st.sampled_from(["/etc/passwd", "/tmp/evil", "../outside/sentinel", "a/../../outside/x", "./a", "a/",
                     "C:/evil", "a\\..\\..\\evil"]),
)
LINK_TARGETS = st.sampled_from(["a", "b/c", ".", "..", "../..", "../outside", "/etc", "/", "a/../..", "model/1",
                                "../outside/sentinel", "x" * 120])
KINDS = st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "chr", "blk", "fifo", "zeros"])


@st.composite
def members(draw):
    return draw(KINDS), draw(NAMES), draw(LINK_TARGETS), draw(st.binary(max_size=64))


def make_tar(path: Path, entries, gz: bool) -> None:
    with tarfile.open(path, "w:gz" if gz else "w", format=tarfile.GNU_FORMAT) as tar:
        for kind, name, target, data in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if kind in ("file", "zeros"):
                payload = data if kind == "file" else bytes(512 << 10)  # zeros: a bomb by size and ratio
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = target if kind in ("symlink", "hardlink") else ""
            info.devmajor, info.devminor = (1, 3) if kind in ("chr", "blk") else (0, 0)
            tar.addfile(info)


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Every path under `root` (not following links) with its type, mode and content digest."""
    state = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(folder) / name
            if skip is not None and (path == skip or skip in path.parents):
                continue
            st_ = path.lstat()
            digest = ""
            if path.is_symlink():
                digest = os.readlink(path)
            elif path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            state[str(path.relative_to(root))] = (st_.st_mode, st_.st_size, digest)
    return state


def assert_inside(dest: Path) -> None:
    real = Path(os.path.realpath(dest))
    for folder, dirs, files in os.walk(dest, followlinks=False):
        for name in dirs + files:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            assert not (os.path.stat.S_ISCHR(mode) or os.path.stat.S_ISBLK(mode) or os.path.stat.S_ISFIFO(mode))
            resolved = Path(os.path.realpath(path))  # a link loop inside is harmless; realpath keeps it
            assert resolved == real or real in resolved.parents, f"{path} resolves outside {dest}: {resolved}"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(members(), min_size=1, max_size=8), gz=st.booleans())
def test_unpacking_check_writes_nothing_outside_target_when_archive_is_generated(entries, gz):
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        sandbox = Path(tmp) / "sandbox"
        (sandbox / "outside").mkdir(parents=True)
        (sandbox / "outside" / "sentinel").write_text("must survive")
        (sandbox / "models").mkdir()
        tar_path = Path(tmp) / ("fuzz.tar.gz" if gz else "fuzz.tar")
        make_tar(tar_path, entries, gz)
        dest = sandbox / "models" / "target"
        before = snapshot(sandbox)
        cwd = os.getcwd()
        os.chdir(sandbox / "models")  # relative names must not escape via the working directory either
        try:
            problems = archive_problems(tar_path, LIMITS)
            report = check(tar_path, LIMITS)
            unpacked = check(tar_path, LIMITS, unpack_to=dest)
        finally:
            os.chdir(cwd)
        assert snapshot(sandbox, skip=dest) == before, "something was written outside the target folder"
        assert_inside(dest)
        assert unpacked.problems == report.problems, "unpacking must not change the verdict"
        assert not problems or report.problems, "tritonpack check must refuse what archive_problems refuses"
        risky = {"chr", "blk", "fifo", "zeros"} & {kind for kind, *_ in entries}
        assert not risky or problems, f"{risky} must be refused"
        if not problems:  # every member written: each file with the bytes of its entry
            written = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
            wanted = {normalise_name(name): data for kind, name, _, data in entries if kind == "file"}
            assert written == wanted
