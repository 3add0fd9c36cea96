"""What a loaded python model hands back to the kernel (`models/shared/resident_memory.py`): the pages of read-only
file mappings leave the process and read back unchanged; a page the process wrote is never dropped; what serving
holds only for its next call goes back once the model is idle, never while a call runs."""

from __future__ import annotations

import ctypes
import json
import mmap
import subprocess
import sys
import time

import pytest

from tritonpack.components import SHARED_DIR, load_model_module

resident_memory = load_model_module("tokenizer", "resident_memory")

PAGES = 64
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


SIZE = PAGES * mmap.PAGESIZE
CONTENT = bytes(range(256)) * (SIZE // 256)


@pytest.fixture
def mapped(tmp_path):
    """map(writable) → the address of a private mapping of a file holding CONTENT, every page read in."""
    path = tmp_path / "data.bin"
    path.write_bytes(CONTENT)
    addresses = []
    with open(path, "rb") as file:
        def map_private(writable: bool) -> int:
            protection = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            address = libc.mmap(None, SIZE, protection, mmap.MAP_PRIVATE, file.fileno(), 0)
            assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
            addresses.append(address)
            assert ctypes.string_at(address, SIZE) == CONTENT
            assert resident_kb(address) == SIZE // 1024
            return address

        yield map_private
    for address in addresses:
        libc.munmap(address, SIZE)


def resident_kb(address: int) -> int:
    return resident_memory.mapping_kb(address, "Rss")


def drop_in_this_mapping_only(monkeypatch, address: int) -> None:  # the whole process: LIBRARY_PROBE
    """drop_load_only_file_pages as it reads the test's mapping, shown only that one: were it ever to drop a page
    the process wrote, only the test's bytes would be lost, not this process's relocated libraries."""
    real = resident_memory.mappings
    with monkeypatch.context() as patch:
        patch.setattr(resident_memory, "mappings", lambda: [m for m in real() if m.low <= address < m.high])
        resident_memory.drop_load_only_file_pages()


def test_read_only_file_pages_are_dropped_and_read_back_unchanged(mapped, monkeypatch):
    address = mapped(writable=False)
    drop_in_this_mapping_only(monkeypatch, address)
    assert resident_kb(address) == 0
    assert ctypes.string_at(address, SIZE) == CONTENT


def test_a_page_the_process_wrote_keeps_its_bytes_even_when_its_mapping_is_read_only_now(mapped, monkeypatch):
    """A written page of a private file mapping exists only in this process (relocated data of a library, made
    read-only after its loader wrote it): dropping it would read the file's bytes back instead."""
    address = mapped(writable=True)
    ctypes.memset(address + 3 * mmap.PAGESIZE, 0xAB, 16)
    assert libc.mprotect(address, SIZE, mmap.PROT_READ) == 0
    drop_in_this_mapping_only(monkeypatch, address)
    assert resident_kb(address) == SIZE // 1024
    assert ctypes.string_at(address + 3 * mmap.PAGESIZE, 16) == b"\xab" * 16
    assert ctypes.string_at(address, mmap.PAGESIZE) == CONTENT[:mmap.PAGESIZE]


def test_a_writable_private_mapping_is_left_alone(mapped, monkeypatch):
    address = mapped(writable=True)
    drop_in_this_mapping_only(monkeypatch, address)
    assert resident_kb(address) == SIZE // 1024


def test_nothing_is_dropped_and_nothing_raises_where_proc_has_no_smaps(mapped, monkeypatch):
    """A sandbox's /proc may lack smaps: the model still loads, with its pages mapped."""
    address = mapped(writable=False)

    def no_smaps(*_args, **_kwargs):
        raise FileNotFoundError("/proc/self/smaps")

    with monkeypatch.context() as patch:
        patch.setattr(resident_memory, "open", no_smaps, raising=False)
        assert resident_memory.drop_load_only_file_pages() == 0
    assert resident_kb(address) == SIZE // 1024


def test_a_mapping_is_left_alone_where_proc_does_not_count_its_written_pages(mapped, monkeypatch):
    """Without `Anonymous` in smaps nothing says a mapping holds no written page: it is kept."""
    address = mapped(writable=False)
    (mapping,) = [m for m in resident_memory.mappings() if m.low <= address < m.high]
    unlabelled = mapping._replace(kb={k: v for k, v in mapping.kb.items() if k != "Anonymous"})
    with monkeypatch.context() as patch:
        patch.setattr(resident_memory, "mappings", lambda: [unlabelled])
        resident_memory.drop_load_only_file_pages()
    assert resident_kb(address) == SIZE // 1024


def test_a_mapping_is_left_alone_where_some_of_its_written_pages_are_swapped_out(mapped, monkeypatch):
    """A written (relocated) page swapped out counts under Swap, not Anonymous: dropping would lose it."""
    address = mapped(writable=False)
    (mapping,) = [m for m in resident_memory.mappings() if m.low <= address < m.high]
    swapped = mapping._replace(kb={**mapping.kb, "Anonymous": 0, "Swap": 4})
    with monkeypatch.context() as patch:
        patch.setattr(resident_memory, "mappings", lambda: [swapped])
        resident_memory.drop_load_only_file_pages()
    assert resident_kb(address) == SIZE // 1024


# a process that computes with numpy's and Python's own libraries: the probes below drop their pages in between
NUMPY_PROCESS = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import resident_memory

def compute():
    a = np.random.default_rng(0).normal(size=(64, 64))
    return repr(((a @ a.T).sum(), np.linalg.svd(a)[1][:3].tolist(), np.fft.rfft(a[0])[:3].tolist()))
"""

LIBRARY_PROBE = NUMPY_PROCESS + """
expected = compute()
dropped = resident_memory.drop_load_only_file_pages()
print(json.dumps({"dropped_mb": dropped / 2**20, "same": expected == compute()}))
"""


def test_a_process_runs_on_unchanged_after_its_library_pages_are_dropped():
    """numpy's and Python's own code pages leave the process and come back as it computes again: same results."""
    probe = json.loads(subprocess.run([sys.executable, "-c", LIBRARY_PROBE, str(SHARED_DIR)], capture_output=True,
                                      text=True, check=True).stdout)
    assert probe["same"], probe
    assert probe["dropped_mb"] > 1, probe


FRAGMENTED_HEAP = """
import ctypes, json, sys, time
sys.path.insert(0, sys.argv[1])
import resident_memory

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(32 * 1024) for _ in range(4000)]  # 125 MiB of heap (below glibc's mmap threshold)
for block in blocks:
    ctypes.memset(block, 1, 32 * 1024)
for block in blocks[:-1]:  # the last block keeps the heap's top: free() alone gives nothing back
    libc.free(block)
heap = resident_memory.ReleasedWhenIdle(idle_s=1.5)
readings = {"freed": resident_memory._rollup_kb("Anonymous")}
with heap:  # a call ends
    pass
with heap:  # the next runs longer than idle_s: no return starts while it runs
    time.sleep(2.0)
    readings["during_a_long_call"] = resident_memory._rollup_kb("Anonymous")
time.sleep(0.3)
readings["within_idle_s"] = resident_memory._rollup_kb("Anonymous")
time.sleep(3.0)
readings["idle"] = resident_memory._rollup_kb("Anonymous")
heap.close()
print(json.dumps(readings))
"""


def test_heap_a_model_freed_goes_back_once_it_has_been_idle_and_not_while_a_call_runs():
    kb = json.loads(subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP, str(SHARED_DIR)], capture_output=True,
                                   text=True, check=True).stdout)
    assert kb["freed"] - kb["during_a_long_call"] < 10_000 and kb["freed"] - kb["within_idle_s"] < 10_000, kb
    assert kb["freed"] - kb["idle"] > 100_000, kb  # of the 125 MiB freed


def test_heap_is_returned_once_per_quiet_spell_not_between_calls_that_keep_coming(monkeypatch):
    returned = []
    monkeypatch.setattr(resident_memory, "return_freed_heap", lambda: returned.append(time.monotonic()))
    monkeypatch.setattr(resident_memory, "drop_load_only_file_pages", lambda: 0)
    heap = resident_memory.ReleasedWhenIdle(idle_s=1.5)
    try:
        for _ in range(30):  # 3 s of calls 0.1 s apart
            last_ended = time.monotonic()
            with heap:
                pass
            time.sleep(0.1)
        assert returned == []
        time.sleep(3.0)
        assert len(returned) == 1 and returned[0] - last_ended >= 1.5, (returned, last_ended)
        time.sleep(2.0)
        assert len(returned) == 1, "returned again with no call in between"
    finally:
        heap.close()


def test_file_pages_go_after_the_longer_quiet_spell_only_and_never_while_a_call_runs(monkeypatch):
    """The library pages, and with them the model's own (`also_unmap`: the encoder's embedding rows)."""
    releases = []
    monkeypatch.setattr(resident_memory, "return_freed_heap", lambda: releases.append(("heap", time.monotonic())))
    monkeypatch.setattr(resident_memory, "drop_load_only_file_pages",
                        lambda: releases.append(("pages", time.monotonic())))
    released = resident_memory.ReleasedWhenIdle(idle_s=0.4, pages_idle_s=1.5,
                                                also_unmap=lambda: releases.append(("rows", time.monotonic())))
    try:
        with released:
            pass
        time.sleep(1.0)  # past idle_s, not past pages_idle_s: the heap only
        assert [kind for kind, _ in releases] == ["heap"], releases
        with released:  # a call within pages_idle_s starts the wait over
            pass
        with released:  # and one running past it holds every release back until it ends
            time.sleep(2.0)
        assert [kind for kind, _ in releases] == ["heap"], releases
        last_ended = time.monotonic()
        time.sleep(2.5)
        assert [kind for kind, _ in releases] == ["heap", "heap", "pages", "rows"], releases
        assert releases[-2][1] - last_ended >= 1.5 - 0.05, (releases, last_ended)
        time.sleep(2.0)
        assert len(releases) == 4, "released again with no call in between"
    finally:
        released.close()


IDLE_LIBRARY_PROBE = NUMPY_PROCESS + """
def mapped_library_kb():  # what drop_load_only_file_pages would unmap
    droppable = set(resident_memory._unwritten_read_only_file_mappings())
    return sum(m.kb.get("Rss", 0) for m in resident_memory.mappings() if (m.low, m.high) in droppable)

released = resident_memory.ReleasedWhenIdle(idle_s=0.2, pages_idle_s=0.6)
with released:
    expected = compute()
serving = mapped_library_kb()
time.sleep(1.5)
idle = mapped_library_kb()
with released:
    again = compute()
released.close()
print(json.dumps({"serving_kb": serving, "idle_kb": idle, "same": expected == again}))
"""


def test_an_idle_process_unmaps_the_library_pages_its_calls_mapped_and_computes_the_same_after():
    """Fault-around maps a library's neighbouring pages with each one a call reads; once idle they leave the process
    (the page cache keeps them) and the next call reads back what it needs."""
    probe = json.loads(subprocess.run([sys.executable, "-c", IDLE_LIBRARY_PROBE, str(SHARED_DIR)],
                                      capture_output=True, text=True, check=True).stdout)
    assert probe["same"], probe
    assert probe["serving_kb"] - probe["idle_kb"] > 1024, probe
