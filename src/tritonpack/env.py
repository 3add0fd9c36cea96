"""Which python model needs which packed environment, and attaching them to a build (`EXECUTION_ENV_PATH`).

A python model that imports only numpy runs in the Triton container's own Python; any other gets the smallest
environment from `tritonpack.backends.ENVIRONMENTS` that provides what it imports, packed (`tritonpack.envpack`)
for the target container's Python and placed beside its config.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tritonpack.backends import DALI_MODULE, ENV_PARAMETER, ENVIRONMENTS, MODEL_DIR_VAR, RUNNER_MODULES
from tritonpack.components import ModelFolder, module_imports
from tritonpack.containers import CONTAINER_PYTHON, container_python, containers_for, version_key
from tritonpack.envpack import PackedEnv, known_envs, pack_env, packer
from tritonpack.errors import EnvError
from tritonpack.server import PYTHON_VERSION

# Environment → the top-level modules it provides (numpy is in every env and in every Triton container).
PROVIDES: dict[str, frozenset[str]] = {name: env.provides for name, env in ENVIRONMENTS.items()}
STUB_MODULES = frozenset({"triton_python_backend_utils", "numpy"})


def required_modules(sources: Mapping[str, str | bytes], parameters: Mapping[str, str]) -> set[str]:
    """Third-party modules a python model needs beyond numpy: its sources' imports (siblings and the standard
    library excluded) plus the framework its `framework` parameter selects."""
    siblings = {Path(name).stem for name in sources}
    modules = set().union(*(module_imports(s) for s in sources.values())) if sources else set()
    if parameters.get("framework") in RUNNER_MODULES:  # the framework runner imports its library lazily
        modules.add(RUNNER_MODULES[parameters["framework"]])
    if parameters.get("artifact", "").endswith(".dali"):  # the portable DALI runner
        modules.add(DALI_MODULE)
    return {m for m in modules - siblings - STUB_MODULES if m not in sys.stdlib_module_names}


def environment_for(folder: ModelFolder) -> tuple[str | None, set[str]]:
    """(env name or None, modules no env provides) for a model folder; numpy-only models need no env."""
    if folder.spec.backend != "python":
        return None, set()
    sources = {name: Path(path).read_bytes() for name, path in folder.files.items() if name.endswith(".py")}
    needs = required_modules(sources, dict(folder.spec.parameters))
    if not needs:
        return None, set()
    candidates = [name for name, provides in PROVIDES.items() if needs <= provides]
    if not candidates:
        covered = set().union(*(p for p in PROVIDES.values() if p & needs))
        return None, needs - covered
    return min(candidates, key=lambda n: len(PROVIDES[n])), set()


@dataclass(frozen=True)
class EnvPlan:
    folders: list[ModelFolder]
    environments: dict[str, dict]  # model name → PackedEnv.info()
    unprovided: dict[str, list[str]]  # model name → modules no env provides (the server's Python must have them)


def attach_environments(folders: Iterable[ModelFolder], envs_dir: Path, python: str | None = None,
                        method: str | None = None) -> EnvPlan:
    """Give every python model that needs more than numpy its packed env, beside its config.pbtxt, and point
    `EXECUTION_ENV_PATH` at it. Numpy-only models are left as they are."""
    out, environments, unprovided = [], {}, {}
    packed: dict[str, PackedEnv] = {}
    for folder in folders:
        env, missing = environment_for(folder)
        if missing:
            unprovided[folder.spec.name] = sorted(missing)
        if env is None:
            out.append(folder)
            continue
        if env not in packed:
            packed[env] = pack_env(env, envs_dir, python=python, method=method)
        env_file = packed[env].filename
        parameters = {**dict(folder.spec.parameters), ENV_PARAMETER: f"{MODEL_DIR_VAR}/{env_file}"}
        out.append(ModelFolder(replace(folder.spec, parameters=parameters),
                               {**folder.files, env_file: packed[env].path}))
        environments[folder.spec.name] = packed[env].info()
    return EnvPlan(out, environments, unprovided)


def manifest_fields(folders: Iterable[ModelFolder], plan: EnvPlan | None) -> dict:
    """What the manifest says about Python: the version the python models need and the containers that have it."""
    folders = list(folders)
    if plan is None:
        unprovided = {}
        for folder in folders:
            env, missing = environment_for(folder)
            needs = (PROVIDES[env] if env else set()) | missing
            if needs:
                unprovided[folder.spec.name] = sorted(needs)
        environments = {}
    else:
        environments, unprovided = plan.environments, plan.unprovided
    pythons = sorted({e["python"] for e in environments.values()})
    if len(pythons) > 1:
        raise EnvError(f"environments for different Pythons in one build: {pythons}")
    python = pythons[0] if pythons else None
    if unprovided:
        containers = []  # stock containers have numpy only; the server's Python must be extended first
    elif python:
        containers = containers_for(python)
    else:
        containers = [f"{first}-{last}" if last != "99.99" else f"{first}+" for first, last, _ in CONTAINER_PYTHON
                      if version_key(first) >= (20, 12)]
    return {"python_version": python, "environments": environments,
            "server_python_needs": unprovided, "supported_containers": containers}


def add_command(subparsers) -> None:
    e = subparsers.add_parser("env", help="pack the python models' environments into dist/envs/")
    e.add_argument("names", nargs="*",
                   help=f"environments (default: text openvino onnx); known: {', '.join(known_envs())}")
    e.add_argument("--python", help=f"the target container's Python minor version (default {PYTHON_VERSION}, the "
                                    f"local stub's); see `--container`")
    e.add_argument("--container", help="Triton container release, e.g. 24.10 (sets --python from the table)")
    e.add_argument("--method", choices=("conda-pack", "venv-pack"), help=f"default here: {packer()}")
    e.add_argument("--out", default="dist/envs")
    e.add_argument("--force", action="store_true", help="rebuild even when an up-to-date one exists")
    e.set_defaults(func=cmd_env)


def cmd_env(args) -> int:
    python = args.python or (container_python(args.container) if args.container else None)
    packed = [pack_env(name, Path(args.out), python=python, method=args.method, force=args.force)
              for name in args.names or ["text", "openvino", "onnx"]]
    for env in packed:
        meta = json.loads(env.path.with_suffix("").with_suffix(".json").read_text())
        print(f"{env.path}: Python {env.python}, {meta['compressed_bytes'] / 1e6:.1f} MB compressed, "
              f"{meta['uncompressed_bytes'] / 1e6:.1f} MB unpacked, {meta['files']} files ({env.method})")
    return 0
