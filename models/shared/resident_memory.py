"""Memory a loaded python model holds for nothing once it has loaded, handed back to the kernel.

- `return_freed_heap`: heap memory freed while loading (glibc keeps it in the arena of the thread that freed it).
- `drop_load_only_file_pages`: pages of library code and read-only data that loading touched (imports, OpenVINO's
  graph passes and compiler) and serving never reads again. They stay in the page cache; the process maps them again
  the moment it reads them, so what serving uses comes back at its first requests and the rest stays out
  (docs/performance.md, twenty-fourth round).
"""

import ctypes
from typing import NamedTuple

MADV_DONTNEED = 4


def return_freed_heap() -> int:
    """Hand the heap memory this process has freed back to the kernel (glibc's `malloc_trim`); the bytes of
    anonymous memory returned, 0 without glibc. glibc keeps freed memory in the arena of the thread that allocated
    it: a session opened (twice, where the check falls back) and warmed on a thread of its own leaves 6-19 MB there,
    of which requests reuse 3-6 (MiniLM, docs/performance.md, nineteenth round)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except AttributeError:
        return 0
    before = _rollup_kb("Anonymous")
    trim(0)
    return max(0, before - _rollup_kb("Anonymous")) * 1024


def drop_load_only_file_pages() -> int:
    """Unmap the resident pages of every private, read-only file mapping that holds no page this process wrote
    (library code, read-only data): the bytes of PSS this process held in them before. Nothing is lost: a read maps
    the page again from the page cache (or the file). Mappings with written pages (relocated data, copy-on-write
    files) and shared ones are left alone; no mapping this process can write is touched, so none gains a written page
    between reading /proc/self/smaps and the advice. Nothing is dropped where /proc does not say which pages were
    written (a sandbox's /proc without smaps, or without their `Anonymous` field): loading never fails for it."""
    before = _rollup_kb("Pss")
    try:
        found = _unwritten_read_only_file_mappings()
    except (OSError, ValueError):
        return 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for low, high in found:
        madvise(low, high - low, MADV_DONTNEED)  # an error leaves the pages mapped: nothing to do about it
    return max(0, before - _rollup_kb("Pss")) * 1024


class Mapping(NamedTuple):
    """One mapping of /proc/self/smaps: its address range, permissions (`r-xp` …), path ("" or `[heap]` …) and its
    kB fields (Rss, Pss, Anonymous …)."""

    low: int
    high: int
    permissions: str
    path: str
    kb: dict[str, int]


def mappings() -> list[Mapping]:
    found = []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields[0].endswith(":"):
                if fields[-1] == "kB":
                    found[-1].kb[fields[0][:-1]] = int(fields[1])
            else:  # a mapping's header: range, permissions, offset, device, inode[, path]
                low, high = (int(x, 16) for x in fields[0].split("-"))
                found.append(Mapping(low, high, fields[1], " ".join(fields[5:]), {}))
    return found


def mapping_kb(address: int, field: str) -> int:
    """`field` (kB) of the mapping that holds `address`."""
    return next(m.kb.get(field, 0) for m in mappings() if m.low <= address < m.high)


def _unwritten_read_only_file_mappings() -> list[tuple[int, int]]:
    return [(m.low, m.high) for m in mappings()
            if m.permissions[1] == "-" and m.permissions[3] == "p" and m.path.startswith("/")
            and not m.path.endswith("(deleted)") and m.kb.get("Anonymous", 1) == 0]


def _rollup_kb(field: str) -> int:
    """`field` (kB) of /proc/self/smaps_rollup; 0 where /proc does not have it (what was returned then reads 0)."""
    try:
        with open("/proc/self/smaps_rollup") as rollup:
            return next(int(line.split()[1]) for line in rollup if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return 0
