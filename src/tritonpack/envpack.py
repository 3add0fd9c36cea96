"""Packed Python environments for python-backend models (`EXECUTION_ENV_PATH`).

Each environment is defined by `envs/<name>/environment.yml` (a conda environment file whose pip section
lists the exact wheels). `pack_env` builds it with conda + conda-pack when `conda` is on PATH, else with a
venv + venv-pack (what CI uses), strips what the models never import (tests, headers, type stubs, build
tools), installs the hook by which loaded models share its libraries (`install_library_sharing`), replaces the
Python modules of its site-packages by their bytecode (`compile_bytecode`), and rewrites
the archive so equal inputs give equal bytes: sorted entries, fixed mtime/owner, gzip without a timestamp, no
build paths.

The stub runs the packed env with the Python it was compiled for, so the env's Python minor version must
equal the target container's (`tritonpack.containers`); a venv-pack env links to that interpreter (`/usr/bin`
on the Triton containers, `--python-prefix`) and includes its site-packages, where the containers have numpy: an env
for containers whose numpy is numpy 1 leaves its own out (`EnvSpec.installed`). Its import check, and the local
Triton's stubs, find a stand-in there (`containers.container_site_environment`).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from tritonpack import CARD_ROOT, archive, backends, library_sharing, repository
from tritonpack.archive import normalise_name
from tritonpack.backends import ENVIRONMENTS
from tritonpack.cache import ArtifactCache, producer
from tritonpack.components import ModelFolder
from tritonpack.errors import EnvError
from tritonpack.repository import FIXED_MTIME, reproducible_gzip, sha256_file
from tritonpack.server import PYTHON_VERSION

ENVS_DIR = CARD_ROOT / "envs"

# Paths inside site-packages that no served model imports: tests, build tooling, headers and type stubs.
STRIP = re.compile(r"(^|/)(tests?|__pycache__|include)(/|$)|\.(pyc|pyi|pxd|h|c)$"
                   r"|(^|/)numpy/(distutils|f2py|_pyinstaller|typing)(/|$)"
                   r"|^bin/(?!python|activate$|activate\.|deactivate)|^bin/activate\.(csh|fish)$|^bin/Activate\.ps1$")

SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")


def extra_strip(name: str, python: str) -> re.Pattern | None:
    """Per-env strip rules beyond `STRIP`, for wheels that ship more than one env can use (part of the env's key).

    dali: nvidia-dali and nvimgcodec ship their Python extension modules for every CPython (3.9…3.15t); only the
    env's own is ever loaded. The portable runner decodes on the CPU (`device_id=None`), so nvimgcodec's GPU
    codec extensions (nvJPEG, nvJPEG2000, nvTIFF; their CUDA libraries are not in the env) are dropped too.

    openvino: the portable runner reads OpenVINO's IR (the builds convert ONNX to it) and compiles it for the CPU
    plugin by name; every other frontend (ONNX included), the GPU, NPU, AUTO, HETERO and batching plugins (and the
    GPU kernel cache), the C API, the cmake files and the conversion tools are never loaded.
    """
    if name == "openvino":
        return re.compile(r"^openvino/libs/(libopenvino_intel_(gpu|npu)_plugin\.so|cache\.json"
                          r"|libopenvino_(auto|auto_batch|hetero)_plugin\.so|libopenvino_c\.so[.\d]*"
                          r"|libopenvino_(onnx|tensorflow|tensorflow_lite|paddle|pytorch|jax|gguf)_frontend\.so[.\d]*)$"
                          r"|^openvino/(tools|cmake|frontend/(onnx|tensorflow|paddle|pytorch|jax))(/|$)")
    if name != "dali":
        return None
    abi = python.replace(".", "")
    return re.compile(rf"\.cpython-(?!{abi}-)\d+t?-x86_64-linux-gnu\.so$"
                      r"|^nvidia/nvimgcodec/extensions/libnv(jpeg|jpeg2k|tiff)_ext\.so")


@dataclass(frozen=True)
class EnvSpec:
    """One environment made of one or more definitions (`envs/<member>/environment.yml`), e.g. `openvino+text`
    for a tarball whose tokenizer needs tokenizers and whose encoder needs openvino."""

    members: tuple[str, ...]
    python: str  # the pin in environment.yml (the documented container's Python)
    packages: tuple[str, ...]  # exact pip requirements

    @property
    def name(self) -> str:
        return "+".join(self.members)

    @classmethod
    def load(cls, names: str | tuple[str, ...]) -> EnvSpec:
        import yaml

        members = tuple(sorted({names} if isinstance(names, str) else set(names)))
        pythons, packages = set(), []
        for name in members:
            path = ENVS_DIR / name / "environment.yml"
            if not path.exists():
                raise EnvError(f"no environment {name!r} ({path} is missing); known: {', '.join(known_envs())}")
            try:
                data = yaml.safe_load(path.read_text())
            except yaml.YAMLError as e:
                raise EnvError(f"{path}: not YAML: {str(e).splitlines()[0]}") from None
            found = []
            dependencies = data.get("dependencies") if isinstance(data, dict) else None
            for dep in dependencies if isinstance(dependencies, list) else ():
                if isinstance(dep, str) and (pin := re.fullmatch(r"python\s*=+\s*(\d+\.\d+)(\.\*)?", dep.strip())):
                    pythons.add(pin[1])
                elif isinstance(dep, dict):
                    found += dep.get("pip", [])
            if not found or len(pythons) != 1:
                raise EnvError(f"{path}: needs dependencies with a python=X.Y pin (the same as the others) and a "
                               f"pip: list")
            bad = [p for p in found if "==" not in p]
            if bad:
                raise EnvError(f"{path}: pin every package exactly (==): {bad}")
            packages += [p for p in found if p not in packages]
        names_pinned = [re.split(r"[=<>!; ]", p, maxsplit=1)[0].lower() for p in packages if ";" not in p]
        clashes = sorted({n for n in names_pinned if names_pinned.count(n) > 1})
        if clashes:
            raise EnvError(f"environments {', '.join(members)} pin {', '.join(clashes)} differently")
        return cls(members, pythons.pop(), tuple(packages))

    def extra_strip(self, python: str) -> re.Pattern | None:
        patterns = [p.pattern for p in (extra_strip(m, python) for m in self.members) if p is not None]
        return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None

    def installed(self, method: str, python: str) -> tuple[str, ...]:
        """What packing with `method` for Python `python` installs. A venv-pack environment includes the container
        Python's site-packages, and where those hold numpy 1 (`containers.takes_container_numpy`; 16 MB of `bert`'s
        46 MB environment) it takes numpy from there, as the stub itself does; a conda one runs a Python of its own,
        so it holds its own numpy, as does one for a Python whose containers' numpy is not known."""
        from tritonpack.containers import takes_container_numpy

        if method == "conda-pack" or not takes_container_numpy(python):
            return self.packages
        return tuple(p for p in self.packages if not re.match(r"numpy\s*==", p))

    def import_check(self) -> list[str]:
        """Modules imported after packing to prove the env works."""
        modules = {"numpy"}
        for member in self.members:
            env = ENVIRONMENTS.get(member)
            if env is not None:
                modules |= env.provides | set(env.import_check)
        return sorted(modules)


def known_envs() -> list[str]:
    return sorted(p.parent.name for p in ENVS_DIR.glob("*/environment.yml"))


@dataclass(frozen=True)
class PackedEnv:
    name: str
    python: str
    path: Path
    packages: tuple[str, ...]
    method: str

    @property
    def filename(self) -> str:
        return self.path.name

    def info(self) -> dict:
        return {"env": self.name, "file": self.filename, "python": self.python, "packages": list(self.packages),
                "packed_with": self.method, "bytes": self.path.stat().st_size}


def packer() -> str:
    return "conda-pack" if shutil.which("conda") else "venv-pack"


def pack_env(names: str | tuple[str, ...], out_dir: Path, python: str | None = None,
             method: str | None = None) -> PackedEnv:
    """Pack the environment of `names` into `out_dir/<name>-py<X.Y>.tar.gz` (a sidecar `.json` records what is in
    it). `python`: the target's Python minor version (default: this interpreter's, which the local stub runs).
    `method`: conda-pack (when conda is on PATH) or venv-pack. Builds get it through the artifact cache
    (`packed_env`), which packs each combination once."""
    spec = EnvSpec.load(names)
    python = python or PYTHON_VERSION
    method = method or packer()
    if method not in ("conda-pack", "venv-pack"):
        raise EnvError(f"unknown packer {method!r}: conda-pack or venv-pack")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{spec.name}-py{python}.tar.gz"
    installed = spec.installed(method, python)
    with tempfile.TemporaryDirectory(prefix=f"env-{spec.name}-", dir=out_dir) as tmp:
        prefix = Path(tmp) / "env"
        (_conda_env if method == "conda-pack" else _venv_env)(spec, python, prefix)
        stats = pack_prefix(prefix, target, python, method)
    target.with_suffix("").with_suffix(".json").write_text(json.dumps(
        {"env": spec.name, "python": python, "packages": list(installed), "packed_with": method, **stats},
        indent=2) + "\n")
    return PackedEnv(spec.name, python, target, installed, method)


@producer("packed-env", libraries=("venv-pack", "conda-pack"),
          code=(ENVS_DIR, *(Path(module.__file__) for module in (library_sharing, archive, backends, repository))))
def packed_env(out_dir: Path, names: tuple[str, ...], python: str, method: str) -> None:
    pack_env(names, out_dir, python, method)


@producer("stored-env")
def stored_env(out_dir: Path, packed: Path) -> None:
    rewrite_as_stored_gzip(packed, out_dir / packed.name)


def cached_env(cache: ArtifactCache, names: tuple[str, ...], python: str | None = None,
               method: str | None = None, stored: bool = False) -> PackedEnv:
    """The packed environment of `names` for `python`, from the artifact cache (packed there once); `stored`: its
    gzip with stored blocks (`rewrite_as_stored_gzip`), as MME tarballs carry it."""
    spec = EnvSpec.load(names)
    python, method = python or PYTHON_VERSION, method or packer()
    folder = cache.get(packed_env, names=spec.members, python=python, method=method)
    path = folder / f"{spec.name}-py{python}.tar.gz"
    if stored:
        path = cache.get(stored_env, packed=path) / path.name
    return PackedEnv(spec.name, python, path, spec.installed(method, python), method)


def rewrite_as_stored_gzip(source: Path, target: Path) -> None:
    """`source`, a gzip file, rewritten as a gzip of stored blocks: the same tar, which Triton's python backend
    unpacks at every load without inflating it, while the MME tarball's own deflate compresses it about as well as
    its packing did; still a gzip, as its `.tar.gz` name says. Through a gateway that vets it, inflated once per
    cold start instead of twice (docs/performance.md, sixty-eighth round)."""
    with gzip.open(source, "rb") as packed, open(target, "wb") as raw, reproducible_gzip(raw, 0) as stored:
        shutil.copyfileobj(packed, stored, 1 << 20)


def pack_prefix(prefix: Path, target: Path, python: str, method: str = "venv-pack") -> dict:
    """Pack an environment folder with conda-pack or venv-pack, then rewrite it reproducibly into `target`."""
    raw = target.with_name(f"{target.name}.{os.getpid()}.raw.tar.gz")
    try:
        if method == "conda-pack":
            _run(["conda-pack", "-p", str(prefix), "-o", str(raw), "--ignore-missing-files", "-q"])
        else:
            _run([sys.executable, "-m", "venv_pack", "-p", str(prefix), "-o", str(raw), "--python-prefix", "/usr",
                  "-q"])
        return normalise_archive(raw, target, python)
    finally:
        raw.unlink(missing_ok=True)


def _run(cmd: list[str], **options) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, **options)
    if result.returncode != 0:
        raise EnvError(f"{' '.join(cmd[:3])} … failed ({result.returncode}):\n{result.stderr[-3000:]}")


def local_python(python: str) -> str:
    """A working interpreter of Python `python` on this machine (this one, one on PATH, or pyenv's)."""
    if python == PYTHON_VERSION:
        return sys.executable
    candidates = [shutil.which(f"python{python}")] + sorted(
        str(p) for p in Path.home().glob(f".pyenv/versions/{python}.*/bin/python{python}"))
    for found in filter(None, candidates):  # a pyenv shim is on PATH even when its version is not selected
        if subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
            return found
    raise EnvError(f"venv-pack needs a local python{python} to build a Python {python} env: install it (e.g. "
                   f"`pyenv install {python}`), or use conda (conda-pack builds any Python), or build without the "
                   f"environment (--no-env; make: NO_ENV=1) for an image that has it")


def _venv_commands(interpreter: str, prefix: Path, packages: list[str], *pip_options: str,
                   system_site: bool = False) -> list[list[str]]:
    """The commands that make a virtual environment of `interpreter` at `prefix` holding `packages`, installed by
    this interpreter's pip (exact pins, so no dependency resolution); `system_site`: it imports the interpreter's
    own site-packages too, after its own."""
    return [[interpreter, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []),
             str(prefix)],
            [sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install", "--quiet",
             "--no-deps", "--disable-pip-version-check", *pip_options, *packages]]


def _venv_env(spec: EnvSpec, python: str, prefix: Path) -> None:
    packages = list(spec.installed("venv-pack", python))
    for command in _venv_commands(local_python(python), prefix, packages, "--no-compile", system_site=True):
        _run(command)
    _finish_env(spec, python, prefix)


def stock_numpy() -> str:
    """The numpy requirement every environment pins: what a stock Triton container's Python holds beyond the
    standard library (its python backend stub imports numpy; models without an environment may too). 24.09's
    image got it from `pip3 install --upgrade "numpy<2"` (Triton 2.51's build.py): 1.26.4, the last numpy 1."""
    pins = {p for name in known_envs() for p in EnvSpec.load(name).packages if re.match(r"numpy\s*==", p)}
    if len(pins) != 1:
        raise EnvError(f"the environments in {ENVS_DIR} pin numpy differently or not at all: {sorted(pins)}")
    return pins.pop()


def stock_site(interpreter: Path, prefix: Path) -> Path:
    """A virtual environment of `interpreter` at `prefix` holding what the container's Python has (numpy), made
    once (pip, from the package index or pip's cache); its bin folder. Made beside `prefix` and moved there whole,
    so a server starting meanwhile sees none or all of it."""
    requirement = stock_numpy()
    marker = prefix / "tritonpack-stock.txt"

    def made() -> bool:
        return marker.exists() and marker.read_text() == requirement

    if made():
        return prefix / "bin"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.", dir=prefix.parent))
    try:
        for step in _venv_commands(str(interpreter), staging, [requirement]):
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                # pip lists no version at all where it reached neither the index nor a cached one
                reach = "reach the package index once (pip caches it), or " \
                    if "(from versions: none)" in done.stderr else ""
                raise EnvError(f"the container's Python has numpy, and {step[2]} could not make {requirement} "
                               f"for {interpreter} ({said}): {reach}serve with --container-python local")
        (staging / marker.name).write_text(requirement)
        if not made():  # else another server made it meanwhile, and may be using it
            shutil.rmtree(prefix, ignore_errors=True)  # another requirement's, or one a crash left half made
            with suppress(OSError):  # made in between after all: that copy serves as well
                staging.rename(prefix)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return prefix / "bin"


def local_stock_site(cache: Path) -> Path:
    """The stand-in for the container's site-packages when the stub is this interpreter's: a folder in `cache`
    linking to this interpreter's numpy (the pin every environment shares, `stock_numpy`)."""
    import numpy

    prefix = cache / f"local-site-py{PYTHON_VERSION}"
    installed = Path(numpy.__file__).resolve().parent.parent
    prefix.mkdir(parents=True, exist_ok=True)
    for item in installed.glob("numpy*"):  # the package, its bundled libraries and its metadata
        link = prefix / item.name
        if not link.is_symlink() or os.readlink(link) != str(item):
            made = prefix / f".{item.name}.{os.getpid()}"
            made.unlink(missing_ok=True)
            made.symlink_to(item)
            made.replace(link)  # atomic: a server starting meanwhile sees the old link or the new one
    return prefix


def stock_site_packages(python: str) -> Path:
    """The site-packages of the stand-in for the container's Python `python` (its numpy; made where missing)."""
    from tritonpack.server import local_cache

    if python == PYTHON_VERSION:
        return local_stock_site(local_cache())
    return site_packages(stock_site(Path(local_python(python)), local_cache() / f"container-site-py{python}").parent,
                         python)


def _conda_env(spec: EnvSpec, python: str, prefix: Path) -> None:  # pragma: no cover - no conda on CI
    if shutil.which("conda") is None:
        raise EnvError("--method conda-pack needs conda on PATH; pack with --method venv-pack instead")
    _run(["conda", "create", "--yes", "--quiet", "-p", str(prefix), "-c", "conda-forge", f"python={python}",
          "pip"])
    _run([str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", "--no-deps",
          *spec.packages])
    _finish_env(spec, python, prefix)


def _finish_env(spec: EnvSpec, python: str, prefix: Path) -> None:
    """Delete what no served model imports, install the library sharing, compile the Python to bytecode, drop the
    files both removed from each wheel's RECORD, then import what the env provides with the env's own Python (`-B`:
    the import check writes nothing into the env; the sharing hook runs and, outside Triton, does nothing), numpy
    from the stand-in for the container's site-packages where the env leaves it to the container."""
    from tritonpack.containers import container_site_environment

    strip_env(prefix, spec.extra_strip(python))
    install_library_sharing(prefix, python)
    compile_bytecode(prefix, python)
    _prune_records(prefix)
    environment = dict(os.environ)
    if not (site_packages(prefix, python) / "numpy").is_dir():
        environment |= container_site_environment(stock_site_packages(python), environment.get("PYTHONPATH"))
    _run([str(prefix / "bin" / "python"), "-B", "-c", "; ".join(f"import {m}" for m in spec.import_check())],
         env=environment)


def site_packages(prefix: Path, python: str) -> Path:
    return prefix / "lib" / f"python{python}" / "site-packages"


def install_library_sharing(prefix: Path, python: str) -> None:
    """Index every shared object of the env by its SHA-256 and install `tritonpack.library_sharing` with the `.pth`
    line that runs it at interpreter start: models loaded from equal environments then map one copy of each."""
    site = site_packages(prefix, python)
    index = {path.relative_to(prefix).as_posix(): sha256_file(path)
             for path in sorted(prefix.rglob("*")) if SHARED_OBJECT.search(path.name) and path.is_file()
             and not path.is_symlink()}
    module = library_sharing.MODULE
    shutil.copyfile(library_sharing.__file__, site / f"{module}.py")
    (site / library_sharing.INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    (site / f"{module}.pth").write_text(library_sharing.PTH_LINE)


def compile_bytecode(prefix: Path, python: str) -> None:
    """Replace each module of the env's site-packages by its bytecode, compiled by the env's own interpreter
    (bytecode is per Python minor version): `module.pyc` where `module.py` was, which Python imports without a
    source. Without it the stubs compile numpy's and the runtime's Python again at every load (0.5 s of Triton's
    load of `bert`); shipping sources beside the bytecode costs 0.3 s of that back in Triton's extraction of the
    extra files (docs/performance.md, eighth round). Tracebacks inside these libraries keep file, line and
    function, not the line's text. One file after another in sorted order, paths relative to `prefix`, source
    hashes instead of mtimes: packing twice gives the same bytes."""
    prefix = prefix.resolve()
    site = site_packages(prefix, python)
    _run([str(prefix / "bin" / "python"), "-m", "compileall", "-q", "-b", "--invalidation-mode", "unchecked-hash",
          "-s", str(prefix), str(site)], env=compile_environment(), cwd=prefix)
    for source in site.rglob("*.py"):
        source.unlink()


def compile_environment() -> dict[str, str]:
    """The environment a compile to bytecode runs in: none of the caller's PYTHON* settings (an optimisation level
    would change the bytecode), a fixed string hash seed — Python 3.10 (24.09's) writes a frozenset constant, as in
    `x in {"a", "b"}`, in its hash order, so with a random seed two packings gave different .pyc bytes — and no
    bytecode written by imports (the env's `.pth` hook runs at the compiler's start: its `__pycache__` file would
    carry the time)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}, "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1"}


_COMPILE_MODULES = ("import json, py_compile, sys\n"
                    "for source, cfile, dfile in json.loads(sys.argv[1]):\n"
                    "    py_compile.compile(source, cfile=cfile, dfile=dfile, doraise=True,\n"
                    "                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)")


def with_bytecode(folders: list[ModelFolder], python: str, into: Path) -> list[ModelFolder]:
    """The folders with each python model's own modules compiled beside them (`1/__pycache__/*.pyc`, written under
    `into`) by a local interpreter of Python `python`, the target container's; hash-checked, so the bytes do not
    depend on times. The stub would otherwise write them into the version folder at load, and a later load that
    polls the step's name (copies of one tarball on an MME) finds the folder changed and reloads the step
    (docs/performance.md, sixteenth round). Without such an interpreter the folders come back as they are."""
    try:
        interpreter = local_python(python)
    except EnvError:
        return folders
    tag = f"cpython-{python.replace('.', '')}"
    into = Path(into).resolve()  # the compiler runs in `into`: a relative path would name a folder inside it
    out, jobs = [], []
    for folder in folders:
        modules = [r for r in sorted(folder.files) if r.endswith(".py")] if folder.spec.backend == "python" else []
        pycs = {f"{Path(r).parent}/__pycache__/{Path(r).stem}.{tag}.pyc": r for r in modules}
        jobs += [(str(Path(folder.files[r]).resolve()), str(into / folder.spec.name / pyc), r)
                 for pyc, r in pycs.items()]
        out.append(ModelFolder(folder.spec, {**folder.files, **{pyc: into / folder.spec.name / pyc for pyc in pycs}}))
    into.mkdir(parents=True, exist_ok=True)
    # isolated as `-I` would (no user site, nothing of the caller's on sys.path), but `-I` would ignore the hash seed
    _run([interpreter, "-s", "-c", _COMPILE_MODULES, json.dumps(jobs)], env=compile_environment(), cwd=into)
    return out


def strip_env(prefix: Path, extra: re.Pattern | None = None) -> None:
    """Delete what no served model imports (`STRIP`, and `extra` for this env) and the `lib64` alias (venv-pack
    would pack a second copy of site-packages through it)."""
    if (prefix / "lib64").is_symlink():
        (prefix / "lib64").unlink()
    for path in sorted(prefix.rglob("*"), reverse=True):
        rel = path.relative_to(prefix).as_posix()
        site = re.sub(r"^lib/python\d+\.\d+/site-packages/", "", rel)
        if not (STRIP.search(site) or (extra is not None and extra.search(site))):
            continue
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def _prune_records(prefix: Path) -> None:
    """Drop the files an env no longer has from each wheel's RECORD."""
    for record in prefix.glob("lib/python*/site-packages/*.dist-info/RECORD"):
        site = record.parent.parent
        lines = record.read_text().splitlines()
        kept = [line for line in lines if (site / line.split(",", 1)[0]).exists()]
        record.write_text("".join(f"{line}\n" for line in kept))


def _pyvenv_cfg(data: bytes, python: str) -> bytes:
    """pyvenv.cfg without the build machine's paths and patch level: `home` points at the container's interpreter
    folder, the version is the target's X.Y (the bytes must not depend on which 3.10.x packed it)."""
    values = {"home": "/usr/bin", "version": python, "version_info": python}
    lines = []
    for line in data.decode().splitlines():
        key = line.split("=", 1)[0].strip()
        if key in ("command", "executable"):
            continue
        lines.append(f"{key} = {values[key]}" if key in values else line)
    return ("\n".join(lines) + "\n").encode()


def normalise_archive(source: Path, target: Path, python: str) -> dict:
    """Rewrite a packed env reproducibly: drop duplicate entries, sort, fixed metadata, no build paths."""
    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    with tarfile.open(source, "r:*") as tar:
        for member in tar:
            name = normalise_name(member.name)
            if not name:
                continue
            data = tar.extractfile(member).read() if member.isfile() else None
            if name == "pyvenv.cfg" and data is not None:
                data = _pyvenv_cfg(data, python)
            if member.issym() and name.startswith("bin/") and member.linkname.startswith("/"):
                member.linkname = f"/usr/bin/python{python}"  # the container's interpreter, not the builder's
            member.name = name
            entries[name] = (member, data)  # a later duplicate (venv-pack writes pyvenv.cfg twice) wins
    if not any(n.startswith(f"lib/python{python}/") for n in entries):
        raise EnvError(f"{source}: no lib/python{python}/ inside; the env was not built for Python {python}")
    tmp = target.with_name(f"{target.name}.{os.getpid()}.partial")  # concurrent packers never share a file
    uncompressed = 0
    with open(tmp, "wb") as raw, reproducible_gzip(raw, 9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as out:
        for name in sorted(entries):
            member, data = entries[name]
            member.mtime = FIXED_MTIME
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            member.pax_headers = {}
            if member.isdir() or member.mode & 0o111:
                member.mode = 0o755
            elif not member.issym():
                member.mode = 0o644
            if data is not None:
                member.size = len(data)
                uncompressed += len(data)
                out.addfile(member, io.BytesIO(data))
            else:
                out.addfile(member)
    tmp.replace(target)
    return {"files": len(entries), "uncompressed_bytes": uncompressed, "compressed_bytes": target.stat().st_size}


