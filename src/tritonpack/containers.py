"""Triton container releases: which Python their python backend stub runs, how to serve a repository in one, and
that Python for the local stub.

The SageMaker Triton images follow the NGC releases of the same number (`sagemaker-tritonserver:<YY.MM>-py3`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from tritonpack.errors import EnvError, UserError

# The SageMaker Triton container the environments and the serving hints are made for unless asked otherwise
# (the newest in the SageMaker Python SDK's image list, sagemaker-tritonserver 24.09: Triton 2.50, Python 3.10).
DEFAULT_CONTAINER = "24.09"

# Triton container release (YY.MM, inclusive ranges) → the Python its python backend stub runs. From Triton's
# release notes ("Contents of the Triton Inference Server container": Ubuntu 18.04 + 3.6, 20.04 + 3.8,
# 22.04 + 3.10, 24.04 + 3.12) and aws/sagemaker-inference-toolkit#134 (py38 up to 23.02, py310 after).
CONTAINER_PYTHON: tuple[tuple[str, str, str], ...] = (
    ("20.03", "20.11", "3.6"),
    ("20.12", "23.02", "3.8"),
    ("23.03", "24.11", "3.10"),
    ("24.12", "99.99", "3.12"),
)

# The last release whose python backend stub cannot read numpy 2: it binds numpy with pybind11 2.10 (python_backend#384
# moved to 2.12 for numpy 2; Triton 2.51's and 2.52's release notes list numpy 2 as a known issue). With numpy 2 in a
# packed environment the stub aborts (`unpack_from requires a buffer of at least …`), seen with the local Triton
# 2.51 (docs/performance.md, fourteenth round). Later releases are not known either way.
NUMPY1_STUB_LAST = "24.11"

# The release of the tritonserver that nvidia-pytriton 0.7.0 bundles (Triton 2.51): the local Triton.
LOCAL_TRITON_RELEASE = "24.10"


# What the SageMaker container's start script (`docker/sagemaker/serve`) passes to tritonserver when a variable of
# the container environment is not set: python backend shared memory of 16 MB, growing by 1 MB.
SERVE_SHM_DEFAULT_BYTES = 16 << 20
SERVE_SHM_GROWTH_BYTES = 1 << 20
ADDITIONAL_ARGS = "SAGEMAKER_TRITON_ADDITIONAL_ARGS"  # appended to tritonserver's flags by serve from 23.07 (2.36)

# The container environment `tritonpack deploy` gives an endpoint's model, and the local MME runs with unless told
# otherwise. Auto-complete off: every config tritonpack renders is complete, and with it on the python backend
# starts one more stub per model at load, imports model.py in it, then sleeps 1 s before stopping it
# (`StubLauncher::UpdateHealth`); docs/performance.md, seventh round.
CONTAINER_ENVIRONMENT: Mapping[str, str] = MappingProxyType({
    "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": str(SERVE_SHM_DEFAULT_BYTES),
    "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": str(SERVE_SHM_GROWTH_BYTES),
    ADDITIONAL_ARGS: "--disable-auto-complete-config",
})


def parse_environment(pairs: list[str] | None, base: Mapping[str, str] = MappingProxyType({})) -> dict[str, str]:
    """`KEY=VALUE` options (`--env`) over `base`; `KEY=` sets an empty value (serve then ignores the variable)."""
    environment = dict(base)
    for pair in pairs or []:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise UserError(f"--env {pair!r}: write KEY=VALUE, e.g. --env {ADDITIONAL_ARGS}=")
        environment[key] = value
    return environment


def serve_flags(environment: Mapping[str, str]) -> list[str]:
    """The tritonserver flags the serve script derives from the variables of the container environment that change
    how a model loads and runs here: python backend shared memory and the additional arguments."""
    shm_default = environment.get("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE") or SERVE_SHM_DEFAULT_BYTES
    shm_growth = environment.get("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE") or SERVE_SHM_GROWTH_BYTES
    return [f"--backend-config=python,shm-default-byte-size={shm_default}",
            f"--backend-config=python,shm-growth-byte-size={shm_growth}",
            *shlex.split(environment.get(ADDITIONAL_ARGS, ""))]


PYTHON_MINOR = re.compile(r"3\.\d{1,2}")


def python_minor(text: str) -> str:
    """An option naming a Python minor version (argparse type), e.g. 3.10."""
    import argparse

    if not PYTHON_MINOR.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: write the Python minor version as X.Y, e.g. 3.10")
    return text


def version_key(version: str) -> tuple[int, int]:
    """(major, minor) of a Triton container release such as `24.09`."""
    if not re.fullmatch(r"\d\d\.\d\d", version):
        raise EnvError(f"{version!r} is not a Triton container release: write YY.MM, e.g. {DEFAULT_CONTAINER}")
    major, minor = version.split(".")
    return int(major), int(minor)


def container_python(container: str) -> str:
    """The Python minor version of a Triton container release such as `24.10`."""
    key = version_key(container)
    for first, last, python in CONTAINER_PYTHON:
        if version_key(first) <= key <= version_key(last):
            return python
    raise EnvError(f"unknown Triton container {container!r}; known from {CONTAINER_PYTHON[0][0]}")


def environment_python(container: str | None, python: str | None, python_option: str) -> str:
    """The Python a packed environment is made for: `python` where given, else `container`'s (the default
    container's where neither is); refused in one line where both are given and disagree."""
    if python and container and container_python(container) != python:
        raise UserError(f"--container {container} runs Python {container_python(container)} and {python_option} "
                        f"{python} asks for another: give one of them ({python_option} is for a Python no container "
                        f"runs, such as the local stub's)")
    return python or container_python(container or DEFAULT_CONTAINER)


def stub_needs_numpy1(container: str) -> bool:
    """Whether the python backend stub of Triton container `container` fails with numpy 2 in its environment."""
    return version_key(container) <= version_key(NUMPY1_STUB_LAST)


def takes_container_numpy(python: str) -> bool:
    """Whether an environment for Python `python` takes numpy from the container's site-packages: Triton containers
    run that Python, and each has numpy 1 there (the releases up to NUMPY1_STUB_LAST; 24.09's build.py installs
    "numpy<2": 1.26.4, the pin of every environment, `envpack.stock_numpy`). Not for a Python no container runs
    (3.11: the local stub's, which starts isolated, so that no stand-in reaches it) nor for 3.12 (24.12 and later,
    whose numpy is not known here)."""
    releases = [last for _, last, py in CONTAINER_PYTHON if py == python]
    return bool(releases) and all(version_key(last) <= version_key(NUMPY1_STUB_LAST) for last in releases)


def containers_for(python: str) -> list[str]:
    """Container release ranges whose Python is `python`, e.g. ['23.03-24.11']."""
    return [f"{first}-{last}" if last != "99.99" else f"{first}+" for first, last, py in CONTAINER_PYTHON
            if py == python]


def docker_command(repository: Path, target: str, container: str = DEFAULT_CONTAINER) -> str:
    """The commands that serve `repository` in the NGC Triton container of that release (GPUs for `gpu`): its MME
    tarball extracted beside it, which carries the packed environment the container's Python lacks (the local
    repository's python models run in this interpreter's environment)."""
    repository = Path(repository).resolve()
    tarball = shlex.quote(str(repository.with_name(f"{repository.name}.tar.gz")))
    served = repository.with_name(f"{repository.name}.triton")
    folder = shlex.quote(str(served))
    # a fresh folder: extracted over an earlier build, its steps of other names would stay and load too
    return (f"rm -rf {folder} && mkdir {folder} && tar -xzf {tarball} -C {folder} && "
            f"{docker_run(served, target, container)}")


def docker_run(models: Path, target: str, container: str = DEFAULT_CONTAINER) -> str:
    """`docker run` of the NGC Triton container of that release (GPUs for `gpu`) serving the repository folder
    `models`."""
    gpus = "--gpus all " if target == "gpu" else ""
    return (f"docker run --rm {gpus}-p8000:8000 -v {shlex.quote(str(Path(models).resolve()))}:/models "
            f"nvcr.io/nvidia/tritonserver:{container}-py3 tritonserver --model-repository=/models")


def manifest_container(manifest: dict | None) -> str | None:
    """The Triton container release a build's manifest says it was built for, when it says so well-formed."""
    built = (manifest or {}).get("build")
    release = built.get("container") if isinstance(built, dict) else None
    return release if isinstance(release, str) and re.fullmatch(r"\d\d\.\d\d", release) else None


def built_for(repository: Path) -> str:
    """The Triton container release `repository` was built for (its manifest), else the default."""
    try:
        manifest = json.loads((Path(repository) / "manifest.json").read_text())
    except (OSError, ValueError):
        return DEFAULT_CONTAINER
    return manifest_container(manifest if isinstance(manifest, dict) else None) or DEFAULT_CONTAINER


# Where the local Triton's stubs find the container's own site-packages (`container_site/sitecustomize.py`)
SITE_HOOK = Path(__file__).resolve().parent / "container_site"
CONTAINER_SITE = "TRITONPACK_CONTAINER_SITE"  # the hook's own name for it (the hook imports nothing of tritonpack)


def container_site_environment(site_packages: Path, pythonpath: str | None) -> dict[str, str]:
    """What the local tritonserver's environment needs so that a stub in a packed environment that includes the
    system site-packages finds `site_packages` after the environment's own, as it finds the container's numpy there
    (`pythonpath`: the variable as it was)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(SITE_HOOK), pythonpath])),
            CONTAINER_SITE: str(site_packages)}


AUTO = "auto"  # the container's Python wanted: the default container's where this machine can run its stub
SYSTEM_BIN = Path("/usr/bin")  # where the containers have their Python, and what a packed environment links to


@dataclass(frozen=True)
class ContainerPython:
    """The container's Python for the local tritonserver's stub, so a tarball's packed environment runs as it will
    in the container (`tritonpack mme --container-python`).

    A packed environment is made for the container's Python (3.10 in 24.09): the python backend runs the stub built
    for that Python and sources the environment's `bin/activate`; the environment's `bin/python3.10` links to
    `/usr/bin/python3.10`, where the container has it, and through that link the stub's Python finds the
    environment's packages. Here the wheel's stub for that minor version runs with a local interpreter of the same
    minor version (on PATH or under pyenv, built with its shared libpython). Where this machine's /usr/bin lacks it,
    tritonserver starts in a private mount namespace whose /usr/bin is this machine's with the interpreter added (a
    read-only overlay only tritonserver and its stubs see), which takes root. The container's Python also has numpy
    for models without an environment: a virtual environment of the local interpreter with numpy stands in for it
    (`stock_bin`, first on tritonserver's PATH, where a stub without an environment looks for its Python; a packed
    environment's activation puts its own first).
    """

    version: str  # minor, e.g. "3.10"
    interpreter: Path
    library_dir: Path  # holds libpython<version>.so.1.0, which the stub links to

    @classmethod
    def find(cls, version: str, fix: str | None = None) -> ContainerPython:
        """The local interpreter of Python `version` that stands in for the container's; one line saying what is
        missing, how to get it and, after, `fix` (by default: serving with the local stub instead)."""
        from tritonpack.envpack import local_python

        fix = fix or "or serve with --container-python local (the local stub then runs this interpreter's packages)"
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

    @classmethod
    def of_default_container(cls) -> ContainerPython:
        """The default container's Python where this machine can run its stub, its stand-in's numpy made where the
        local Triton looks for it at start (`local_cache`); else one line saying why not."""
        from tritonpack.server import local_cache

        python = cls.find(container_python(DEFAULT_CONTAINER), fix="then start again")
        python.stock_bin(local_cache())  # made now: where it cannot be (pip offline), the caller serves otherwise
        return python

    @property
    def executable_name(self) -> str:
        return f"python{self.version}"

    def needs_overlay(self) -> bool:
        return not (SYSTEM_BIN / self.executable_name).exists()

    def stock_bin(self, cache: Path) -> Path:
        """The bin folder of the stand-in for the container's own Python: this interpreter with numpy."""
        from tritonpack.envpack import stock_site

        return stock_site(self.interpreter, cache / f"container-site-py{self.version}")

    def stock_site_packages(self, cache: Path) -> Path:
        """The site-packages of that stand-in, where its numpy is."""
        from tritonpack.envpack import site_packages

        return site_packages(self.stock_bin(cache).parent, self.version)

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
