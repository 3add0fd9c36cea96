"""The container's Python for the local stub (`containers.ContainerPython`): which interpreter stands in for it,
and how tritonserver is started so a packed environment's link to `/usr/bin/pythonX.Y` reaches it. Served for real
in `tests/test_tarball.py` (the default tarball through the local MME on Python 3.10)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tritonpack import containers
from tritonpack.containers import ContainerPython
from tritonpack.errors import UserError
from tritonpack.server import PYTHON_VERSION


def this_interpreter(monkeypatch, system_bin: Path) -> ContainerPython:
    monkeypatch.setattr(containers, "SYSTEM_BIN", system_bin)
    return ContainerPython.find(PYTHON_VERSION)


def test_find_names_the_interpreter_itself_and_its_shared_library(monkeypatch, tmp_path):
    python = this_interpreter(monkeypatch, tmp_path)
    assert python.interpreter == Path(sys.executable)  # what it says of itself: pyenv's shims are scripts
    assert (python.library_dir / f"libpython{PYTHON_VERSION}.so.1.0").exists()


def test_launcher_shows_the_interpreter_in_usr_bin_to_tritonserver_alone_where_it_is_missing(monkeypatch, tmp_path):
    python = this_interpreter(monkeypatch, tmp_path / "bin")
    command = python.launcher(tmp_path / "cache")
    link = tmp_path / "cache" / f"container-bin-py{PYTHON_VERSION}" / f"python{PYTHON_VERSION}"
    assert os.readlink(link) == str(python.interpreter)
    assert command[:4] == [shutil.which("unshare"), "--mount", "--propagation", "private"]
    script = command[command.index("-c") + 1]
    assert f"lowerdir={link.parent}:{tmp_path / 'bin'} {tmp_path / 'bin'}" in script and script.endswith('exec "$@"')
    assert python.launcher(tmp_path / "cache") == command  # the link made once is reused


def test_launcher_is_empty_where_usr_bin_has_the_interpreter(monkeypatch, tmp_path):
    (tmp_path / f"python{PYTHON_VERSION}").symlink_to(sys.executable)
    assert this_interpreter(monkeypatch, tmp_path).launcher(tmp_path / "cache") == []


def test_find_says_in_one_line_how_to_get_a_missing_interpreter():
    with pytest.raises(UserError, match=r"^the local Triton runs the Python 3\.99 stub with a local python3\.99, and "
                                        r"there is none: install it \(e\.g\. `pyenv install 3\.99`\), or serve "
                                        r"with --container-python local") as raised:
        ContainerPython.find("3.99")
    assert "\n" not in str(raised.value)


def test_find_refuses_an_interpreter_without_its_shared_library(monkeypatch, tmp_path):
    fake = tmp_path / "python3.99"
    fake.write_text(f"#!/bin/sh\necho {tmp_path / 'python3.99'}\necho {tmp_path}\n")
    fake.chmod(0o755)
    monkeypatch.setattr("tritonpack.envpack.local_python", lambda version: str(fake))
    with pytest.raises(UserError, match=rf"^{fake} has no shared libpython3\.99\.so\.1\.0 \(in {tmp_path}\), which "
                                        r"the stub needs: build it with --enable-shared"):
        ContainerPython.find("3.99")


def test_find_refuses_to_add_the_interpreter_to_usr_bin_without_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match=rf"{tmp_path}/python{PYTHON_VERSION} is not there, and only root can show it "
                                        r"to tritonserver alone"):
        this_interpreter(monkeypatch, tmp_path)


def test_stock_site_holds_the_environments_numpy_and_is_made_once(monkeypatch, tmp_path):
    """The container's own Python has numpy: the stand-in is a virtual environment of the interpreter with the
    numpy every environment pins, which a stub without an environment reaches first on PATH."""
    import subprocess

    from tritonpack.envpack import stock_numpy, stock_site

    python = this_interpreter(monkeypatch, tmp_path)
    bin_dir = python.stock_bin(tmp_path / "cache")
    assert bin_dir == tmp_path / "cache" / f"container-site-py{PYTHON_VERSION}" / "bin"
    version = subprocess.run([bin_dir / "python3", "-c", "import numpy; print(numpy.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert f"numpy=={version}" == stock_numpy()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f"container-site-py{PYTHON_VERSION}"]
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("made again"))
    assert stock_site(python.interpreter, bin_dir.parent) == bin_dir


def test_stock_site_says_in_one_line_what_pip_could_not_install_and_leaves_nothing(monkeypatch, tmp_path):
    from tritonpack import envpack
    from tritonpack.errors import EnvError

    monkeypatch.setattr(envpack, "stock_numpy", lambda: "numpy==1.26.4 ; not a marker")
    with pytest.raises(EnvError, match=rf"^the container's Python has numpy, and pip could not make "
                                       rf"numpy==1\.26\.4 ; not a marker for {sys.executable} \(.+\): serve with "
                                       r"--container-python local$") as raised:
        envpack.stock_site(Path(sys.executable), tmp_path / "site")
    assert "\n" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(EnvError, match=r"^the container's Python has numpy, and venv could not make numpy==1\.26\.4 "
                                       r"; not a marker for /bin/false \(exit status 1\)"):
        envpack.stock_site(Path("/bin/false"), tmp_path / "site")
    assert list(tmp_path.iterdir()) == []
    # only where pip found no version at all (no index reached, nothing cached) is the index the fix
    monkeypatch.setattr(envpack, "stock_numpy", lambda: "tritonpack-not-a-package==1.0")
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(EnvError, match=r"\(ERROR: No matching distribution found for tritonpack-not-a-package==1\.0\): "
                                       r"reach the package index once \(pip caches it\), or serve with "
                                       r"--container-python local$"):
        envpack.stock_site(Path(sys.executable), tmp_path / "site")
    assert list(tmp_path.iterdir()) == []


def test_local_mme_auto_runs_the_default_containers_python_where_it_can(monkeypatch, tmp_path, caplog):
    """`tritonpack mme`'s default: the container's Python where this machine runs its stub; else this
    interpreter's stub, with one line saying why the tarballs' environments will not run and how to fix it: no
    local python3.10, or no numpy for its stand-in of the container's Python (pip offline)."""
    import logging

    from tritonpack import envpack
    from tritonpack.containers import AUTO, DEFAULT_CONTAINER, container_python
    from tritonpack.errors import EnvError
    from tritonpack.mme import LocalMME

    python = container_python(DEFAULT_CONTAINER)
    (tmp_path / "models").mkdir()
    mme = LocalMME(str(tmp_path / "models"), cache_dir=tmp_path / "cache", container_python=AUTO)
    assert mme.triton.container_python.version == python == mme.manager.store.python

    def missing(version):
        raise EnvError("none")

    monkeypatch.setattr(envpack, "local_python", missing)
    with caplog.at_level(logging.WARNING, logger="tritonpack.mme"):
        mme = LocalMME(str(tmp_path / "models"), cache_dir=tmp_path / "other-cache", container_python=AUTO)
    assert mme.triton.container_python is None and mme.manager.store.python == PYTHON_VERSION
    assert [r.getMessage() for r in caplog.records] == [
        f"python models run with this interpreter's stub and packages, not from their tarballs' environments as on "
        f"a {DEFAULT_CONTAINER} endpoint: the local Triton runs the Python {python} stub with a local python{python}, "
        f"and there is none: install it (e.g. `pyenv install {python}`), then start again (--container-python local: "
        f"the same without this line)"]
    caplog.clear()
    monkeypatch.undo()
    monkeypatch.setattr(envpack, "stock_numpy", lambda: "numpy==1.26.4 ; not a marker")  # as pip fails offline
    monkeypatch.setenv("TRITONPACK_CACHE", str(tmp_path / "empty-cache"))
    with caplog.at_level(logging.WARNING, logger="tritonpack.mme"):
        mme = LocalMME(str(tmp_path / "models"), cache_dir=tmp_path / "third-cache", container_python=AUTO)
    assert mme.triton.container_python is None
    [offline] = [r.getMessage() for r in caplog.records]
    assert f"as on a {DEFAULT_CONTAINER} endpoint: the container's Python has numpy, and pip could not make" in offline


@pytest.mark.parametrize("system_site", [True, False], ids=["includes_system_site", "isolated"])
def test_container_site_comes_after_an_environments_own_packages_only_where_it_includes_the_system_site(
        tmp_path, system_site):
    """The local stubs' stand-in for the container's site-packages (`containers.container_site_environment`): a
    packed environment whose pyvenv.cfg includes the system site-packages imports what it lacks from there, and its
    own copy of what both have; an isolated one sees none of it; the hook's own folder leaves sys.path."""
    import subprocess

    site = tmp_path / "container-site"
    site.mkdir()
    (site / "only_in_container.py").write_text("WHERE = 'container'\n")
    (site / "in_both.py").write_text("WHERE = 'container'\n")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *(["--system-site-packages"] * system_site),
                    str(env)], check=True)
    next(env.glob("lib/python*/site-packages")).joinpath("in_both.py").write_text("WHERE = 'environment'\n")
    probe = ("import sys, in_both\ntry:\n    import only_in_container\n    only = only_in_container.WHERE\n"
             "except ImportError:\n    only = None\nprint(in_both.WHERE, only, str(sys.path))")
    said = subprocess.run([env / "bin" / "python", "-c", probe], capture_output=True, text=True, check=True,
                          env={**os.environ, **containers.container_site_environment(site, "/elsewhere")}).stdout
    both, only, path = said.split(" ", 2)
    assert (both, only) == ("environment", "container" if system_site else "None")
    assert str(containers.SITE_HOOK) not in path and "/elsewhere" in path


def test_local_stock_site_links_this_interpreters_numpy(tmp_path):
    import numpy

    from tritonpack.envpack import local_stock_site

    site = local_stock_site(tmp_path)
    assert site == tmp_path / f"local-site-py{PYTHON_VERSION}"
    assert (site / "numpy").resolve() == Path(numpy.__file__).resolve().parent
    assert local_stock_site(tmp_path) == site and len(list(site.iterdir())) >= 2  # its metadata too
