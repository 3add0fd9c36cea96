"""Memory a loaded python model holds for nothing once it has loaded, handed back to the kernel.

- `return_freed_heap`: heap memory freed while loading (glibc keeps it in the arena of the thread that freed it).
- `ReleasedWhenIdle`: heap memory that serving freed (and a GPU's cached blocks), handed back once the model has
  been idle for a while; after a longer quiet spell, the file pages serving mapped as well (library code, the
  encoder's embedding rows).
- `drop_load_only_file_pages`: pages of library code and read-only data that loading touched (imports, OpenVINO's
  graph passes and compiler) and serving never reads again. They stay in the page cache; the process maps them again
  the moment it reads them, so what serving uses comes back at its first requests and the rest stays out
  (docs/performance.md, twenty-fourth round).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import NamedTuple

MADV_DONTNEED = 4
IDLE_S = 2.0  # ReleasedWhenIdle: no call for this long, and the freed heap goes back
PAGES_IDLE_S = 10.0  # ReleasedWhenIdle: no call for this long, and the library pages go too


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


class ReleasedWhenIdle:
    """What a loaded model holds only for its next call, handed back once it has had none for a while; each call runs
    inside `with released:`. A release never starts while a call runs; a call that begins during one (~20 ms) shares
    the CPU with it.

    - After `idle_s`: the heap memory serving freed (`return_freed_heap`). Calls of varied batch sizes fragment
      glibc's heap, which then holds the high-water mark of every size seen: a TorchScript ResNet-50 fed batches of 1
      to 8 held 737 MB of anonymous memory where 304 MB were in use. Returned under load it would cost every call its
      pages faulted in again (+12-16 % there); returned when idle it costs the first call after a quiet spell that
      (+17 % on one batch of 4) and an idle model holds only what it uses (docs/performance.md, twenty-eighth round).
      `also_release`, called right after, hands back what else the model caches for its next call: on a GPU, the
      device memory torch's allocator keeps (`torch.cuda.empty_cache`), which the other models an MME loads on that
      GPU can then use.
    - After `pages_idle_s`: the library pages serving mapped (`drop_load_only_file_pages`). Each page a call reads
      from a library maps its neighbours in the page cache with it (the kernel's fault-around, up to 64 kB): the
      encoder's stub maps 11 MB of OpenVINO's CPU plugin of which its calls read 2 MB. Unmapped, the pages stay in
      the page cache, reclaimable, and the next call maps back what it reads: an idle loaded `bert` holds 21 MB less,
      the first request after the quiet spell takes ~1.3 ms longer (docs/performance.md, fiftieth round). The longer
      wait keeps that cost off traffic that pauses for seconds. `also_unmap`, called right after, unmaps the other
      file pages the model's calls mapped: the embedding rows the OpenVINO encoder gathers from its weights file in
      place, MiniLM's whole 23 MB table under varied text (−22 MB per idle loaded `bert`, ~0.6 ms on the next call;
      fifty-third round)."""

    def __init__(self, idle_s: float = IDLE_S, pages_idle_s: float = PAGES_IDLE_S,
                 also_release: Callable[[], object] | None = None, also_unmap: Callable[[], object] | None = None):
        self._idle_s = idle_s
        self._pages_idle_s = max(pages_idle_s, idle_s)
        self._also_release, self._also_unmap = also_release, also_unmap
        self._ended = threading.Event()  # a call ended
        self._lock = threading.Lock()
        self._running = 0
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="release-when-idle", daemon=True)
        self._thread.start()

    def __enter__(self) -> None:
        with self._lock:
            self._running += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._running -= 1
        self._ended.set()

    def close(self) -> None:
        self._closed = True
        self._ended.set()
        self._thread.join()

    def _watch(self) -> None:
        while self._ended.wait() and not self._closed:
            self._ended.clear()
            while self._ended.wait(self._idle_s) and not self._closed:  # another call ended within idle_s
                self._ended.clear()
            if not self._idle():  # one still running (longer than idle_s) ends later
                continue
            return_freed_heap()
            if self._also_release is not None:
                self._also_release()
            # a call ending meanwhile starts the watch over; one still running when the wait ends releases after it
            if not self._ended.wait(self._pages_idle_s - self._idle_s) and self._idle():
                drop_load_only_file_pages()
                if self._also_unmap is not None:
                    self._also_unmap()

    def _idle(self) -> bool:
        return not self._closed and not self._running


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


def mappings(pid: int | str = "self") -> list[Mapping]:
    """The mappings of process `pid` (this one by default), from /proc/<pid>/smaps."""
    found = []
    with open(f"/proc/{pid}/smaps") as smaps:
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
            and not m.path.endswith("(deleted)") and m.kb.get("Anonymous", 1) == 0
            and m.kb.get("Swap", 0) == 0]  # a written page swapped out counts there, not in Anonymous


def _rollup_kb(field: str) -> int:
    """`field` (kB) of /proc/self/smaps_rollup; 0 where /proc does not have it (what was returned then reads 0)."""
    try:
        with open("/proc/self/smaps_rollup") as rollup:
            return next(int(line.split()[1]) for line in rollup if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return 0
