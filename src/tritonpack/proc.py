"""What Linux's /proc says about processes: process-group members, CPU time, memory, listening sockets, and the
python stubs.

One place for the readings the server (its stubs and their /dev/shm regions), the soak (memory growth) and the
benchmarks (CPU seconds, PSS) need. A process that exits while it is read is skipped, never an error.

Memory, all in kB:
- RSS counts every resident page a process maps, so summing RSS over processes that share pages (libraries,
  the python backend's /dev/shm regions, mapped model files) counts those pages once per process.
- PSS (proportional set size) charges each shared page to its n sharers 1/n each: the PSS of a process group
  summed counts every page once, whoever in the group maps it (pages also mapped by processes outside the group,
  e.g. libraries of another Python, are charged partly to those).
- private = Private_Clean + Private_Dirty, shared = Shared_Clean + Shared_Dirty (from smaps_rollup); anonymous,
  file and shmem are the parts of RSS that `status` reports (RssAnon, RssFile, RssShmem).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SHM = Path("/dev/shm")
STUB_BINARY = b"triton_python_backend_stub"
SHM_PREFIX = "triton_python_backend_shm_region"
KB_PER_MB = 1e6 / 1024  # /proc counts kB of 1,024 bytes; the project's MB (goals, reports) are 10^6 bytes
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessStat:
    """From /proc/<pid>/stat: state (R, S, Z: zombie, X: dead …), process group, user + system CPU seconds."""

    pid: int
    state: str
    group: int
    cpu_seconds: float

    @property
    def exited(self) -> bool:
        """A zombie (waiting for its parent to collect it) or dead."""
        return self.state in ("Z", "X")


def stat(pid: int) -> ProcessStat | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
        fields = text[text.rindex(")") + 2:].split()  # after the command name: state, ppid, pgrp, …
        return ProcessStat(pid, fields[0], int(fields[2]), (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND)
    except (OSError, ValueError, IndexError):
        return None


def pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def processes() -> Iterator[ProcessStat]:
    """Every process readable in /proc, zombies included."""
    for pid in pids():
        if (found := stat(pid)) is not None:
            yield found


def group_members(pgid: int) -> list[int]:
    """Every process (zombies included) in process group `pgid`."""
    return [p.pid for p in processes() if p.group == pgid]


def group_cpu_seconds(groups: Iterable[int]) -> float:
    """User + system CPU seconds of the live members of these process groups (exited members are not counted)."""
    wanted = set(groups)
    return sum(p.cpu_seconds for p in processes() if p.group in wanted) if wanted else 0.0


def command_line(pid: int) -> list[bytes]:
    """The process's arguments (empty for a zombie or a process that is gone)."""
    try:
        return [a for a in (PROC / str(pid) / "cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def stub_model_file(args: list[bytes]) -> Path | None:
    """The model.py a python backend stub runs, from its command line (`stub <folder>/1/model.py …`)."""
    if len(args) > 1 and STUB_BINARY in args[0]:
        return Path(args[1].decode(errors="replace"))
    return None


def stub_model(args: list[bytes]) -> str | None:
    """The name of the model folder a python backend stub serves, from its command line."""
    model_file = stub_model_file(args)
    return model_file.parent.parent.name if model_file else None


def stub_shm_regions(args: list[bytes]) -> set[str]:
    """The /dev/shm region a python stub's command line names."""
    return {a.decode() for a in args if a.startswith(SHM_PREFIX.encode())}


def mapped_files(pid: int) -> dict[str, tuple[str, int]]:
    """The files process `pid` maps: path (with ` (deleted)` for a removed one) → (device, inode); empty when the
    process is gone."""
    files = {}
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/"):
                files[fields[5]] = (fields[3], int(fields[4]))
    return files


def mapped_shm_regions(pid: int) -> set[str]:
    """The python backend's /dev/shm regions process `pid` maps (tritonserver maps every stub's)."""
    names = (path.rsplit("/dev/shm/", 1)[-1] for path in mapped_files(pid) if "/dev/shm/" in path)
    return {name.removesuffix(" (deleted)") for name in names if name.startswith(SHM_PREFIX)}


def process_name(pid: int) -> str:
    """`stub:<model>` for a python stub, else the program's file name."""
    args = command_line(pid)
    if not args:
        return str(pid)
    model = stub_model(args)
    return f"stub:{model}" if model else Path(args[0].decode(errors="replace")).name


@dataclass(frozen=True)
class Listener:
    """A TCP socket listening at `address` (IPv4 for an IPv4-mapped IPv6 one), by its socket inode."""

    address: str
    inode: int


def listeners(port: int, pid: int | str = "self") -> list[Listener]:
    """The TCP sockets listening on `port` in the network namespace of process `pid` (/proc/<pid>/net/tcp and
    tcp6, where state 0A is LISTEN)."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                packed = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
                ip = ipaddress.ip_address(packed)
                found.append(Listener(str(getattr(ip, "ipv4_mapped", None) or ip), int(fields[9])))
    return found


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds open (empty when it is gone or not ours to read)."""
    inodes = set()
    with suppress(OSError):
        for fd in (PROC / str(pid) / "fd").iterdir():
            with suppress(OSError):
                if (target := os.readlink(fd)).startswith("socket:["):
                    inodes.add(int(target[len("socket:["):-1]))
    return inodes


@dataclass(frozen=True)
class Memory:
    """Resident memory of one process in kB (module docstring: what each figure counts)."""

    rss: int
    pss: int
    private: int
    shared: int
    anonymous: int
    file: int
    shmem: int


def available_kb() -> int:
    """Memory the machine can still give without swapping (`MemAvailable`)."""
    return _kb_fields(PROC / "meminfo")["MemAvailable"]


def _kb_fields(path: Path) -> dict[str, int]:
    values = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            values[name] = int(parts[0])
    return values


def memory(pid: int) -> Memory | None:
    try:
        status = _kb_fields(PROC / str(pid) / "status")
        rollup = _kb_fields(PROC / str(pid) / "smaps_rollup")
    except OSError:
        return None
    if "VmRSS" not in status:  # a zombie or a kernel thread
        return None
    return Memory(
        rss=status["VmRSS"], pss=rollup.get("Pss", 0),
        private=rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0),
        shared=rollup.get("Shared_Clean", 0) + rollup.get("Shared_Dirty", 0),
        anonymous=status.get("RssAnon", 0), file=status.get("RssFile", 0), shmem=status.get("RssShmem", 0),
    )


def memory_by_process(members: Iterable[int]) -> dict[str, Memory]:
    """`name[pid]` → Memory for each process that is still there."""
    found = {}
    for pid in members:
        if (m := memory(pid)) is not None:
            found[f"{process_name(pid)}[{pid}]"] = m
    return found


def shm_resident_kb(regions: Iterable[str]) -> int:
    """Pages of these /dev/shm files that are resident (tmpfs allocates a page when it is first touched)."""
    total = 0
    for region in regions:
        with suppress(OSError):
            total += (SHM / region).stat().st_blocks * 512 // 1024
    return total
