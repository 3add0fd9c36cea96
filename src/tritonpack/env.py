"""Which python model needs which packed environment, and attaching them to a build (`EXECUTION_ENV_PATH`).

A python model that imports only numpy runs in the Triton container's own Python; any other gets the smallest
environment from `tritonpack.backends.ENVIRONMENTS` that provides what it imports, packed (`tritonpack.envpack`)
for the target container's Python and placed beside its config.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tritonpack.backends import DALI_MODULE, ENV_PARAMETER, ENVIRONMENTS, MODEL_DIR_VAR, RUNNER_MODULES
from tritonpack.cache import ArtifactCache
from tritonpack.components import ModelFolder, module_imports
from tritonpack.containers import (
    CONTAINER_PYTHON,
    DEFAULT_CONTAINER,
    containers_for,
    environment_python,
    python_minor,
    version_key,
)
from tritonpack.envpack import EnvSpec, cached_env, known_envs, packer
from tritonpack.server import PYTHON_VERSION

# Environment → the top-level modules it provides (numpy is in every Triton container's Python, and every env has
# it: its own, or the container's site-packages).
PROVIDES: dict[str, frozenset[str]] = {name: env.provides for name, env in ENVIRONMENTS.items()}
STUB_MODULES = frozenset({"triton_python_backend_utils", "numpy"})
# Standard modules that the containers' Pythons (CONTAINER_PYTHON: 3.8, 3.10, 3.12) disagree on, by the minor that
# added or removed them (What's New in Python 3.11: tomllib; 3.12: distutils, PEP 632, and imp, asynchat, asyncore,
# smtpd). This interpreter's `sys.stdlib_module_names` knows only its own version.
STDLIB_ADDED = {"tomllib": 11}
STDLIB_REMOVED = dict.fromkeys(("asynchat", "asyncore", "distutils", "imp", "smtpd"), 12)


def is_stdlib(module: str) -> bool:
    """In the standard library of this Python or of another the containers run."""
    return module in sys.stdlib_module_names or module in STDLIB_ADDED or module in STDLIB_REMOVED


def stdlib_lacks(python: str, module: str) -> str | None:
    """Why Python `python` (X.Y) has no standard module `module` that another Python has; None when it is not such
    a module."""
    minor = int(python.split(".")[1])
    if minor < STDLIB_ADDED.get(module, 0):
        return f"added in Python 3.{STDLIB_ADDED[module]}"
    if minor >= STDLIB_REMOVED.get(module, 99):
        return f"removed in Python 3.{STDLIB_REMOVED[module]}"
    return None


def required_modules(sources: Mapping[str, str | bytes], parameters: Mapping[str, str],
                     python: str | None = None) -> set[str]:
    """Third-party modules a python model needs beyond numpy: its sources' imports (siblings and the standard
    library excluded) plus the framework its `framework` parameter selects. A source that does not parse (as Python
    `python` X.Y, when given) raises SyntaxError naming it."""
    siblings = {Path(name).stem for name in sources}
    modules: set[str] = set()
    for name, source in sources.items():
        try:
            modules |= module_imports(source, python)
        except SyntaxError as e:
            e.filename = name
            raise
    if parameters.get("framework") in RUNNER_MODULES:  # the framework runner imports its library lazily
        modules.add(RUNNER_MODULES[parameters["framework"]])
    if parameters.get("artifact", "").endswith(".dali"):  # the portable DALI runner
        modules.add(DALI_MODULE)
    return {m for m in modules - siblings - STUB_MODULES if not is_stdlib(m)}


def envs_covering(needs: set[str]) -> tuple[tuple[str, ...], set[str]]:
    """The packed environments that provide `needs` — the smallest one that has them all, else each one that has
    some of them (they are packed as one) — and what no environment provides."""
    if not needs:
        return (), set()
    whole = [name for name, provides in PROVIDES.items() if needs <= provides]
    if whole:
        return (min(whole, key=lambda n: len(PROVIDES[n])),), set()
    parts = tuple(sorted(name for name, provides in PROVIDES.items() if provides & needs))
    return parts, needs - set().union(*(PROVIDES[name] for name in parts))


def environment_for(folder: ModelFolder) -> tuple[tuple[str, ...], set[str]]:
    """(the environments a model folder runs in, modules no env provides); numpy-only models need none."""
    if folder.spec.backend != "python":
        return (), set()
    sources = {name: Path(path).read_bytes() for name, path in folder.files.items() if name.endswith(".py")}
    return envs_covering(required_modules(sources, dict(folder.spec.parameters)))


@dataclass(frozen=True)
class EnvPlan:
    folders: list[ModelFolder]  # python models that need more than numpy point at the environment
    top_files: dict[str, Path]  # the environment's file at the top of the repository
    environment: dict | None  # PackedEnv.info(); None when every python model needs numpy only
    users: list[str]  # the models that run in it


def attach_environment(folders: Iterable[ModelFolder], cache: ArtifactCache, python: str | None = None,
                       method: str | None = None) -> EnvPlan | None:
    """One packed environment for the whole repository, at its top: every python model that needs more than numpy
    runs in it (`EXECUTION_ENV_PATH` = `$$TRITON_MODEL_DIRECTORY/../<file>`). Triton's python backend extracts a
    file once however many models name it, so their stubs share its libraries; the file's gzip holds stored blocks
    (`envpack.rewrite_as_stored_gzip`), which it unpacks without inflating. Numpy-only models run in the
    container's own Python. None when a model imports what no environment can carry (torch, tensorflow): the
    server's Python must provide everything then, and packing the rest would not make the tarball deployable."""
    folders = list(folders)
    needs = {folder.spec.name: environment_for(folder) for folder in folders}
    if any(missing for _, missing in needs.values()):
        return None
    members = tuple(sorted({env for envs, _ in needs.values() for env in envs}))
    if not members:
        return EnvPlan(folders, {}, None, [])
    packed = cached_env(cache, members, python, method, stored=True)
    value = f"{MODEL_DIR_VAR}/../{packed.filename}"
    users = [name for name, (envs, _) in needs.items() if envs]
    out = [ModelFolder(replace(f.spec, parameters={**dict(f.spec.parameters), ENV_PARAMETER: value}), f.files)
           if f.spec.name in users else f for f in folders]
    return EnvPlan(out, {packed.filename: packed.path}, packed.info(), users)


def manifest_fields(folders: Iterable[ModelFolder], plan: EnvPlan | None) -> dict:
    """What the manifest says about Python: the python models, the environment, the Python it is for, and the
    containers that run it; without a plan (a local-only repository), what the server's Python would have to
    provide."""
    folders = list(folders)
    unprovided = {}
    if plan is None:
        for folder in folders:
            envs, missing = environment_for(folder)
            needs = set().union(*(PROVIDES[env] for env in envs)) | missing
            if needs:
                unprovided[folder.spec.name] = sorted(needs)
        environment, users = None, []
    else:
        environment, users = plan.environment, plan.users
    python = environment["python"] if environment else None
    if unprovided:
        containers = []  # stock containers have numpy only; the server's Python must be extended first
    elif python:
        containers = containers_for(python)
    else:
        containers = [f"{first}-{last}" if last != "99.99" else f"{first}+" for first, last, _ in CONTAINER_PYTHON
                      if version_key(first) >= (20, 12)]
    return {"python_models": sorted(f.spec.name for f in folders if f.spec.backend == "python"),
            "python_version": python, "environment": environment, "environment_users": users,
            "server_python_needs": unprovided, "supported_containers": containers}


def add_command(subparsers) -> None:
    e = subparsers.add_parser("env", help="pack the python models' environments into dist/envs/")
    e.add_argument("names", nargs="*",
                   help=f"environments (default: text openvino onnx); known: {', '.join(known_envs())}; "
                        f"NAME+NAME packs one environment of both")
    e.add_argument("--python", type=python_minor,
                   help=f"the target Python minor version instead of --container's (e.g. {PYTHON_VERSION}, the "
                        f"local stub's)")
    e.add_argument("--container",
                   help=f"Triton container release whose Python the environments are for (default {DEFAULT_CONTAINER}, "
                        f"as `build`)")
    e.add_argument("--method", choices=("conda-pack", "venv-pack"), help=f"default here: {packer()}")
    e.add_argument("--out", default="dist/envs")
    e.add_argument("--cache", default="dist/cache", help="the artifact cache the environments are packed into once")
    e.set_defaults(func=cmd_env)


def cmd_env(args) -> int:
    python = environment_python(args.container, args.python, "--python")
    wanted = args.names or ["text", "openvino", "onnx"]
    for names in wanted:  # a misspelt name is said before anything is written
        EnvSpec.load(tuple(names.split("+")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for names in wanted:
        env = cached_env(ArtifactCache(Path(args.cache)), tuple(names.split("+")), python, args.method)
        for source in (env.path, env.path.with_suffix("").with_suffix(".json")):
            shutil.copyfile(source, out / source.name)
        meta = json.loads(env.path.with_suffix("").with_suffix(".json").read_text())
        print(f"{out / env.filename}: Python {env.python}, {meta['compressed_bytes'] / 1e6:.1f} MB compressed, "
              f"{meta['uncompressed_bytes'] / 1e6:.1f} MB unpacked, {meta['files']} files ({env.method})")
    return 0
