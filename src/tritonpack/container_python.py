"""The Triton container's Python for the local tritonserver, so a tarball's packed environment runs as it will there.

A packed environment is made for the container's Python (3.10 in 24.09): the python backend runs the stub built for
that Python, sources the environment's `bin/activate`, and the environment's `bin/python3.10` links to
`/usr/bin/python3.10`, where the container has it; through that link the stub's Python finds the environment's
packages. Here the wheel's stub for that minor version runs with a local interpreter of the same minor version (on
PATH or under pyenv, built with its shared libpython). Where this machine's /usr/bin lacks that interpreter,
tritonserver starts in a private mount namespace whose /usr/bin is this machine's with the interpreter added (a
read-only overlay, seen by tritonserver and its stubs only): that takes root. The container's own Python also has
numpy for models without an environment; the local interpreter has what it has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tritonpack.errors import UserError

SYSTEM_BIN = Path("/usr/bin")  # where the containers have their Python, and what a packed environment links to


@dataclass(frozen=True)
class ContainerPython:
    version: str  # minor, e.g. "3.10"
    interpreter: Path
    library_dir: Path  # holds libpython<version>.so.1.0, which the stub links to

    @classmethod
    def find(cls, version: str) -> ContainerPython:
        """The local interpreter of Python `version` that stands in for the container's; one line saying what is
        missing and how to get it otherwise."""
        from tritonpack.envpack import local_python
        from tritonpack.errors import EnvError

        fix = f"or serve without --container-python {version} (the local stub then runs this interpreter's packages)"
        try:
            found = local_python(version)
        except EnvError:
            raise UserError(f"the local Triton runs the Python {version} stub with a local python{version}, and "
                            f"there is none: install it (e.g. `pyenv install {version}`), {fix}") from None
        # the interpreter itself, not a launcher script such as pyenv's shim
        interpreter, library_dir = map(Path, subprocess.run(
            [found, "-c", "import sys, sysconfig; print(sys.executable); print(sysconfig.get_config_var('LIBDIR'))"],
            capture_output=True, text=True, check=True).stdout.split())
        if not (library_dir / f"libpython{version}.so.1.0").exists():
            raise UserError(f"{interpreter} has no shared libpython{version}.so.1.0 (in {library_dir}), which the "
                            f"stub needs: build it with --enable-shared (pyenv: PYTHON_CONFIGURE_OPTS="
                            f"--enable-shared pyenv install {version}), {fix}")
        python = cls(version, interpreter, library_dir)
        if python.needs_overlay() and os.geteuid() != 0:
            raise UserError(f"{SYSTEM_BIN / python.executable_name} is not there, and only root can show it to "
                            f"tritonserver alone (a private mount namespace): run as root, {fix}")
        return python

    @property
    def executable_name(self) -> str:
        return f"python{self.version}"

    def needs_overlay(self) -> bool:
        return not (SYSTEM_BIN / self.executable_name).exists()

    def launcher(self, cache: Path) -> list[str]:
        """The command that runs a command (appended) with the interpreter where packed environments look for it."""
        if not self.needs_overlay():
            return []
        extra = cache / f"container-bin-py{self.version}"
        extra.mkdir(parents=True, exist_ok=True)
        link = extra / self.executable_name
        if not link.is_symlink() or os.readlink(link) != str(self.interpreter):
            made = extra / f".{self.executable_name}.{os.getpid()}"
            made.unlink(missing_ok=True)
            made.symlink_to(self.interpreter)
            made.replace(link)  # atomic: another server starting meanwhile sees the old link or the new one
        # `unshare` without --fork and `exec`: tritonserver keeps the pid this command starts with
        mount = f"mount -t overlay overlay -o lowerdir={extra}:{SYSTEM_BIN} {SYSTEM_BIN}"
        return [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private",
                "sh", "-c", f'{mount} && exec "$@"', "container-python"]

    def library_path(self, base: str) -> str:
        return f"{base}{os.pathsep}{self.library_dir}" if base else str(self.library_dir)
