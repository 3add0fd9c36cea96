"""Archive safety: hostile tarballs are refused with the exact reason; the read that unpacks while it checks (the
local MME's) writes only inside its own folder, and never what it refuses."""

from __future__ import annotations

import gzip
import io
import random
import re
import tarfile
from pathlib import Path

import pytest

from tests.reliability import hostile
from tritonpack.archive import ArchiveLimits, Problem, normalise_name, scan
from tritonpack.check import check

SMALL = ArchiveLimits(max_members=50, max_total_bytes=4 << 20, max_member_bytes=2 << 20, max_ratio=50,
                      ratio_floor_bytes=1 << 20)


def archive_problems(tar_path: Path, limits: ArchiveLimits | None = None) -> list[Problem]:
    """What the archive rules alone say of `tar_path` (`check` says these first, and nothing more of an unsafe one)."""
    with open(tar_path, "rb") as f:
        return scan(f, Path(tar_path).name, limits or ArchiveLimits())


def member(name: str, data: bytes | None = b"x", kind: bytes = tarfile.REGTYPE, link: str = "",
           size: int | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    if kind == tarfile.REGTYPE:
        info.size = len(data) if size is None else size
    return info, data if kind == tarfile.REGTYPE else None


def make_tar(path: Path, members, gz: bool = True, form: int = tarfile.GNU_FORMAT) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=form) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0) if gz else raw.getvalue())
    return path


NOISE = random.Random(0).randbytes(6 << 20)  # incompressible, so only the size limits apply
GOOD = [member("m", None, tarfile.DIRTYPE), member("m/config.pbtxt", b'name: "m"\n'),
        member("m/1/model.py", b"print()\n")]

HOSTILE = {
    "traversal": ([member("m/../../evil.txt")], Problem("m/../../evil.txt", "path", "'..' leads outside the archive")),
    "parent_first": ([member("../evil")], Problem("../evil", "path", "'..' leads outside the archive")),
    "parent_after_a_folder": ([member("a/../../evil")], Problem("a/../../evil", "path",
                                                                "'..' leads outside the archive")),
    "absolute": ([member("/tmp/evil.txt")], Problem("/tmp/evil.txt", "path", "absolute path")),
    "symlink_out": ([member("m/link", None, tarfile.SYMTYPE, "../../etc")],
                    Problem("m/link", "link", "symlink to ../../etc leads outside the archive")),
    "symlink_absolute": ([member("m/link", None, tarfile.SYMTYPE, "/etc/passwd")],
                         Problem("m/link", "link", "symlink to /etc/passwd leads outside the archive")),
    # a repository needs no links: a chain whose text stays inside (l -> ., s -> l/../../..) climbs out through l,
    # and a dangling one passed as a model file
    "symlink_chain": ([member("m/l", None, tarfile.SYMTYPE, "."), member("m/s", None, tarfile.SYMTYPE, "l/../..")],
                      Problem("m/s", "link", "a link; MME tarballs carry no links")),
    "symlink_dangling": ([member("m/model.onnx", None, tarfile.SYMTYPE, "nowhere.onnx")],
                         Problem("m/model.onnx", "link", "a link; MME tarballs carry no links")),
    "write_through_link": ([member("m/dir", None, tarfile.SYMTYPE, "sub"), member("m/dir/file")],
                           Problem("m/dir/file", "path", "inside m/dir, which is a link")),
    "hardlink_out": ([member("m/hard", None, tarfile.LNKTYPE, "../../etc/passwd")],
                     Problem("m/hard", "link", "hard link to ../../etc/passwd leads outside the archive")),
    "hardlink_absolute": ([member("m/hard", None, tarfile.LNKTYPE, "/etc/passwd")],
                          Problem("m/hard", "link", "hard link to /etc/passwd leads outside the archive")),
    "hardlink_dangling": ([member("m/hard", None, tarfile.LNKTYPE, "m/none")],
                          Problem("m/hard", "link", "hard link to m/none, which is not an earlier file here")),
    "file_over_folder": ([member("m/sub/file"), member("m/sub")],
                         Problem("m/sub", "path", "not a folder, but earlier entries are inside it")),
    "char_device": ([member("m/null", None, tarfile.CHRTYPE)], Problem("m/null", "type", "device file")),
    "block_device": ([member("m/sda", None, tarfile.BLKTYPE)], Problem("m/sda", "type", "device file")),
    "fifo": ([member("m/pipe", None, tarfile.FIFOTYPE)], Problem("m/pipe", "type", "FIFO")),
    "duplicate": ([member("m/config.pbtxt", b"a"), member("./m/config.pbtxt", b"b")],
                  Problem("./m/config.pbtxt", "path", "duplicate entry (a later member would overwrite an earlier "
                                                      "one)")),
    "bomb_by_count": ([member(f"m/f{i}") for i in range(51)],
                      Problem("hostile.tar.gz", "members", "more than 50 entries (limit max_members)")),
    "bomb_by_member_size": ([member("m/big", NOISE[:3 << 20])],
                            Problem("m/big", "size", f"{3 << 20} bytes is above the {2 << 20} byte limit "
                                                     f"(max_member_bytes)")),
    "bomb_by_total_size": ([member(f"m/part{i}", NOISE[i << 20:(i << 20) + (3 << 19)]) for i in range(3)],
                           Problem("hostile.tar.gz", "size", f"members declare more than {4 << 20} bytes "
                                                             f"(limit max_total_bytes)")),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_archive_problems_name_file_field_reason_when_tarball_is_hostile(tmp_path, case):
    members, expected = HOSTILE[case]
    tar = make_tar(tmp_path / "hostile.tar.gz", GOOD + members)
    assert expected in archive_problems(tar, SMALL)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_unpacking_check_writes_only_inside_its_folder_and_no_refused_member_when_tarball_is_hostile(tmp_path, case):
    """`check(unpack_to=)` writes the members it passes while it reads them: the good ones before the hostile one
    land in its folder (which the caller removes, tests/test_mme_store.py), the hostile one nowhere."""
    members, expected = HOSTILE[case]
    tar = make_tar(tmp_path / "hostile.tar.gz", GOOD + members)
    root = tmp_path / "root"
    unpacked = root / "cache" / "model"
    (root / "cache").mkdir(parents=True)
    assert expected in check(tar, SMALL, unpack_to=unpacked).problems
    written = list(root.rglob("*"))
    assert all(p == root / "cache" or unpacked in (p, *p.parents) for p in written), written
    assert not any(p.is_symlink() or not (p.is_file() or p.is_dir()) for p in written), written
    assert not (tmp_path / "evil.txt").exists()
    kept = {p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*")}
    # a refused member's name holds an earlier member only: a duplicate's first copy (GOOD's), the folder a file
    # would have covered
    assert normalise_name(expected.file) not in kept or case in ("duplicate", "file_over_folder"), kept
    assert (unpacked / "m" / "config.pbtxt").read_bytes() == b'name: "m"\n'
    assert case != "file_over_folder" or (unpacked / "m" / "sub").is_dir()


def test_archive_problems_refuse_members_a_damaged_header_hides_from_tarfile(tmp_path):
    """tarfile ends the archive at a damaged header; GNU tar skips it and extracts what follows, over the members
    checked before it (here a second config.pbtxt)."""
    checked, hidden, ends = io.BytesIO(), io.BytesIO(), []
    for out, members in ((checked, GOOD), (hidden, [member("m/config.pbtxt", b"this_is_not_a_field: 1\n")])):
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
            ends.append(tar.offset)  # where the end-of-archive blocks begin
    body = checked.getvalue()[:ends[0]]
    path = tmp_path / "hidden.tar.gz"
    path.write_bytes(gzip.compress(body + b"G" * tarfile.BLOCKSIZE + hidden.getvalue(), mtime=0))
    assert archive_problems(path, SMALL) == [Problem("hidden.tar.gz", "archive", "not a readable tar or tar.gz: data "
                                                     "after the end of the archive (a damaged header or a second "
                                                     "archive hides members)")]


def test_archive_problems_refuse_a_second_archive_after_the_end_of_the_first_when_gzipped(tmp_path):
    """Two tars gzipped as one: tarfile and plain tar stop at the first one's end, `tar -i` extracts the second
    (here a model.py the check never saw); only the end-of-archive blocks and tar's zero padding may follow."""
    archives = []
    for members in (GOOD, [member("m/1/model.py", b"import os\nos.system('evil')\n")]):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        archives.append(out.getvalue())
    path = tmp_path / "concatenated.tar.gz"
    path.write_bytes(gzip.compress(archives[0] + archives[1], mtime=0))
    assert archive_problems(path, SMALL) == [Problem("concatenated.tar.gz", "archive", "not a readable tar or "
                                                     "tar.gz: data after the end of the archive (a damaged header or "
                                                     "a second archive hides members)")]
    path.write_bytes(gzip.compress(archives[0] + bytes(10 * tarfile.RECORDSIZE), mtime=0))  # padding: accepted
    assert archive_problems(path, SMALL) == []


@pytest.mark.parametrize("form", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_archive_problems_refuse_a_name_too_long_to_hold_in_memory(tmp_path, form):
    """tarfile reads a GNU long name or PAX records whole before the member is seen: a 2 MB tar.gz held a 200 MiB
    name (426 MB of memory to check it)."""
    path = make_tar(tmp_path / "long.tar.gz", GOOD + [member("m/" + "a" * (2 << 20))], form=form)
    with tarfile.open(path) as probe:  # what the tar holds: one extended header, the name inside it
        assert len(probe.getmembers()[-1].name) == 2 + (2 << 20)
    (problem,) = archive_problems(path, SMALL)
    assert (problem.file, problem.field) == ("long.tar.gz", "archive")
    assert re.fullmatch(r"not a readable tar or tar.gz: an extended header of \d+ bytes \(names and PAX records "
                        r"are under 1048576\)", problem.reason), problem


def test_archive_problems_refuse_a_sparse_member_that_declares_more_than_it_inflates(tmp_path):
    import subprocess

    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    with open(folder / "model.onnx", "wb") as f:
        f.truncate(3 << 20)  # above SMALL's member limit too: one problem names the sparseness either way
    subprocess.run(["tar", "--sparse", "-czf", str(tmp_path / "sparse.tar.gz"), "-C", str(tmp_path), "m"],
                   check=True)
    assert (tmp_path / "sparse.tar.gz").stat().st_size < 1000
    assert Problem("m/1/model.onnx", "type", "sparse file") in archive_problems(tmp_path / "sparse.tar.gz", SMALL)


def test_archive_problems_stop_early_when_gzip_is_a_ratio_bomb(tmp_path):
    # 64 MiB of zeros in one member that declares a modest size per entry: caught by the ratio, mid-stream
    limits = ArchiveLimits(max_ratio=100, ratio_floor_bytes=8 << 20)
    tar = make_tar(tmp_path / "bomb.tar.gz", [member(f"m/zeros{i}", bytes(16 << 20)) for i in range(4)])
    assert tar.stat().st_size < 1 << 20
    problems = archive_problems(tar, limits)
    assert len(problems) == 1 and problems[0].file == "bomb.tar.gz" and problems[0].field == "size"
    assert problems[0].reason.startswith("compression ratio above 100 ")


def test_archive_problems_flag_unreadable_archive_when_bytes_are_not_a_tar(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(gzip.compress(b"not a tar at all" * 100))
    [problem] = archive_problems(bad)
    assert (problem.file, problem.field) == ("bad.tar.gz", "archive")
    assert problem.reason.startswith("not a readable tar or tar.gz")


def _damaged(data: bytes, damage: str) -> bytes:
    if damage == "content":  # bytes flipped inside a member's compressed data: it may still inflate, to wrong bytes
        return hostile.damaged(data)
    if damage == "crc":
        return data[:-8] + bytes(4) + data[-4:]
    if damage == "block_type":  # the first deflate block (after gzip's 10-byte header) claims the reserved type 3
        return data[:10] + bytes([data[10] | 0b110]) + data[11:]
    if damage == "appended":
        return data + b"garbage"
    if damage == "second_member":  # two tarballs joined: gzip reads on into the second, where tar finds data
        return data + data
    return data[:len(data) // 2]  # truncated


@pytest.mark.parametrize(("damage", "reason"), [
    ("content", "not a readable tar or tar.gz: CRC check failed"),
    ("crc", "not a readable tar or tar.gz: CRC check failed"),
    ("block_type", "not a readable tar or tar.gz: corrupt gzip data: "),
    ("truncated", "not a readable tar.gz: its gzip data ends before the end-of-stream marker (a download or copy "
                  "cut short)"),
    ("appended", "not a readable tar.gz: the last 7 bytes follow the end of its gzip data and are not gzip (a file "
                 "appended to, or two files joined)"),
    ("second_member", "not a readable tar or tar.gz: data after the end of the archive")])
def test_corrupt_gzip_is_refused_and_nothing_extracted_when_the_tar_inside_still_parses(tmp_path, damage, reason):
    text = b"".join(b"line %d of a model file\n" % i for i in range(20000))
    good = make_tar(tmp_path / "good.tar.gz", GOOD + [member("m/1/weights.txt", text)])
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(_damaged(good.read_bytes(), damage))
    [problem] = archive_problems(bad)
    assert (problem.file, problem.field) == ("bad.tar.gz", "archive")
    assert problem.reason.startswith(reason)
    [unpacking] = check(bad, SMALL, unpack_to=tmp_path / "out").problems  # the same reason where it unpacks
    assert unpacking == problem


def test_unpacking_check_writes_every_member_with_data_filter_modes_when_tarball_is_safe(tmp_path):
    tool = member("m/1/tool.sh", b"#!/bin/sh\n")
    tool[0].mode = 0o4777  # setuid, writable by all: the `data` filter's 0o755
    shared = member("m/1/data/shared.txt", b"x\n")
    shared[0].mode = 0o666
    tar = make_tar(tmp_path / "good.tar.gz", GOOD + [member("m/1/data", None, tarfile.DIRTYPE),
                                                     member("m/1/data/labels.txt", b"cat\n"), tool, shared])
    check(tar, SMALL, unpack_to=tmp_path / "out")
    dest = tmp_path / "out"
    assert (dest / "m" / "config.pbtxt").read_text() == 'name: "m"\n'
    assert (dest / "m" / "1" / "model.py").read_bytes() == b"print()\n"
    assert (dest / "m" / "1" / "data" / "labels.txt").read_bytes() == b"cat\n"
    assert {p.relative_to(dest).as_posix() for p in dest.rglob("*")} == {
        "m", "m/config.pbtxt", "m/1", "m/1/model.py", "m/1/data", "m/1/data/labels.txt", "m/1/tool.sh",
        "m/1/data/shared.txt"}
    assert [(dest / f).stat().st_mode & 0o7777 for f in ("m/1/tool.sh", "m/1/data/shared.txt", "m/1/model.py")] \
        == [0o755, 0o644, 0o644]


def test_unpacking_check_accepts_plain_tar_when_not_gzipped(tmp_path):
    tar = make_tar(tmp_path / "good.tar", GOOD, gz=False)
    assert archive_problems(tar) == []
    check(tar, SMALL, unpack_to=tmp_path / "out")
    assert (tmp_path / "out" / "m" / "1" / "model.py").read_bytes() == b"print()\n"


def test_unpacking_check_refuses_a_folder_that_exists(tmp_path):
    tar = make_tar(tmp_path / "good.tar.gz", GOOD)
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        check(tar, SMALL, unpack_to=tmp_path / "out")


def test_problem_prints_one_line_when_converted_to_str():
    assert str(Problem("bert/config.pbtxt", "line 3", "bad")) == "bert/config.pbtxt: line 3: bad"


def test_archive_limits_reject_nonpositive_values_when_configured():
    with pytest.raises(ValueError):
        ArchiveLimits(max_members=0)
