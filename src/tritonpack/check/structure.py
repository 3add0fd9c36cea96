"""The structural checks of `tritonpack check`: layout, configs, ensemble wiring, environments, manifest.

They work on a `Tree` (read from a folder or a tarball's stream) and never open an artifact: they stay fast.
"""

from __future__ import annotations

import difflib
import json
import posixpath
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonpack.archive import Problem
from tritonpack.backends import ENV_PARAMETER, LOADED_FILES, MODEL_DIR_VAR, PLATFORMS
from tritonpack.check.tree import Tree, is_version_folder
from tritonpack.components import load_model_module
from tritonpack.containers import LOCAL_TRITON_RELEASE, container_python, manifest_container, stub_needs_numpy1
from tritonpack.spec import config_parameters, parse_config
from tritonpack.wiring import wiring_problems

MAX_MODELS_WITHOUT_WARNING = 5
WARMUP_FOLDER = "warmup"  # model_warmup's input_data_file is read from <model>/warmup/
# Folders of a model that Triton skips when it looks for versions (core constants.h, kModelConfigFolder too)
NOT_VERSION_FOLDERS = frozenset({WARMUP_FOLDER, "initial_state", "configs"})


@dataclass
class CheckReport:
    path: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    unchecked: list[Problem] = field(default_factory=list)  # --deep: what could not be checked here, and why
    models: list[str] = field(default_factory=list)
    ensemble: str | None = None  # the entry point: the ensemble, or the only model
    configs: dict = field(default_factory=dict, repr=False)  # model folder → parsed ModelConfig
    envs: dict = field(default_factory=dict, repr=False)  # packed environment's path → what it holds (EnvInfo)

    @property
    def ok(self) -> bool:
        return not self.problems


# How Triton's SageMaker front-end finds a tarball's ensemble: a search of each config's text, not its parse (a
# single-quoted or spaced spelling parses as the same config, and the front-end then loads another model)
SAGEMAKER_ENSEMBLE = re.compile(r'platform:\s*"ensemble"')


def _parse(tree: Tree, name: str) -> tuple[object | None, Problem | None]:
    try:
        text = tree.texts[name].decode("utf-8")
    except KeyError:
        return None, Problem(name, "file", "too large to be a config")
    except UnicodeDecodeError as e:
        return None, Problem(name, "file", f"not UTF-8 text ({e.reason} at byte {e.start})")
    try:
        return parse_config(text), None
    except text_format.ParseError as e:
        line, column = e.GetLine(), e.GetColumn()
        reason = re.sub(r"^\d+:\d+\s*:\s*", "", str(e))
        where = f"line {line}" + (f" column {column}" if column else "")
        return None, Problem(name, where, reason)


@dataclass(frozen=True)
class StubTarget:
    """What runs the python models: the stub's Python minor (and where that came from) and the Triton container
    release, each None when unknown."""
    python: str | None
    source: str = ""
    container: str | None = None


PYTHON_OPTION = "--python"  # what names the stub's Python when the check is told it


@dataclass(frozen=True)
class ServerPython:
    """The Python a server runs python models without a packed environment in: whether it imports a module, and its
    numpy version where known (the local Triton's); `stub` says what runs the stub when the check is told its
    Python."""
    has: Callable[[str], bool]
    numpy: str | None = None
    stub: str = PYTHON_OPTION


STOCK_CONTAINER_PYTHON = ServerPython(lambda module: False)  # numpy only, which python models may always import


def container_stub_python(python: str) -> ServerPython:
    """The local MME on the container's Python (`--container-python`): numpy only without an environment, as in the
    container, and a stub of that Python."""
    return ServerPython(STOCK_CONTAINER_PYTHON.has, stub=f"the local MME runs the Python {python} container's stub; "
                                                         f"--container-python X.Y runs another's, local this "
                                                         f"interpreter's")


def stub_target(manifest: dict | None, python: str | None, container: str | None, stub: str) -> StubTarget:
    release = container or manifest_container(manifest)  # a malformed --container fails in container_python
    if python:
        return StubTarget(python, stub, release)
    if container:
        return StubTarget(container_python(container), f"Triton container {container}", container)
    if manifest and re.fullmatch(r"3\.\d+", declared := str(manifest.get("python_version"))):
        return StubTarget(declared, "manifest.json python_version", release)
    return StubTarget(None, "", release)


def check_tree(tree: Tree, label: str, python: str | None = None, container: str | None = None,
               server: ServerPython | None = None) -> CheckReport:
    report = CheckReport(label)
    problems, warnings = report.problems, report.warnings
    top_dirs, top_files = tree.children("")
    manifest = None
    if "manifest.json" in top_files:
        try:
            manifest = json.loads(tree.texts["manifest.json"])
            if not isinstance(manifest, dict):
                raise ValueError("not a JSON object")
        except (KeyError, ValueError) as e:
            problems.append(Problem("manifest.json", "file", f"not readable JSON: {e}"))
            manifest = None
    target = stub_target(manifest, python, container, server.stub if server else PYTHON_OPTION)
    no_env_fix = _no_environment_fix(manifest)

    configs = {}
    for folder in top_dirs:
        config_path = f"{folder}/config.pbtxt"
        if config_path not in tree.files:
            problems.append(Problem(config_path, "file", "missing: every top-level folder must be a model folder"))
            continue
        cfg, problem = _parse(tree, config_path)
        if problem:
            problems.append(problem)
            continue
        if cfg.name and cfg.name != folder:
            problems.append(Problem(config_path, "name", f"{cfg.name!r} differs from its folder name {folder!r}"))
        configs[folder] = cfg
        problems.extend(_config_problems(tree, folder, cfg))
        problems.extend(_model_problems(tree, folder, cfg, target, warnings, no_env_fix,
                                        server or STOCK_CONTAINER_PYTHON))
    report.models, report.configs, report.envs = sorted(configs), configs, tree.envs
    ensembles = sorted(name for name, cfg in configs.items() if cfg.platform == "ensemble")
    entry, entry_problems = _entry_point(label, top_dirs, top_files, configs, ensembles)
    problems.extend(entry_problems)
    report.ensemble = entry
    folder_of = {cfg.name or folder: folder for folder, cfg in configs.items()}
    by_name = {name: configs[folder] for name, folder in folder_of.items()}
    versions = {name: _versions(tree, folder) for name, folder in folder_of.items()}
    for folder, cfg in configs.items():
        if cfg.platform != "ensemble" and SAGEMAKER_ENSEMBLE.search(tree.texts[f"{folder}/config.pbtxt"].decode()):
            problems.append(Problem(f"{folder}/config.pbtxt", "platform", 'not an ensemble, but its text says '
                                    'platform: "ensemble" (in a comment or a string), which is how SageMaker\'s '
                                    'front-end finds the ensemble: it may serve this model instead; remove that text'))
    for name in ensembles:
        if not SAGEMAKER_ENSEMBLE.search(tree.texts[f"{name}/config.pbtxt"].decode()):
            problems.append(Problem(f"{name}/config.pbtxt", "platform", 'SageMaker\'s front-end finds the ensemble by '
                                    'the text platform: "ensemble" (double quotes, no space before the colon) and '
                                    'would serve another model of the tarball: write it so'))
        for where, reason in wiring_problems(configs[name], by_name, versions):
            problems.append(Problem(f"{name}/config.pbtxt", where, reason))
        used = {step.model_name for step in configs[name].ensemble_scheduling.step}
        for unused in sorted(set(configs) - used - {name}):
            warnings.append(Problem(f"{unused}/config.pbtxt", "name", f"not a step of ensemble {name}; it loads "
                                                                      f"but nothing calls it"))
    if entry is not None:
        warnings.extend(_batched_text_readers(configs, folder_of, entry))
    if len(top_dirs) > MAX_MODELS_WITHOUT_WARNING:
        warnings.append(Problem(label, "models", f"{len(top_dirs)} model folders (more than "
                                                 f"{MAX_MODELS_WITHOUT_WARNING}): each loads in every MME instance "
                                                 f"that serves this target, slowing cold starts"))
    if manifest is not None:
        problems.extend(_manifest_problems(tree, manifest, report.ensemble))
    report.problems = list(dict.fromkeys(problems))  # an environment several models use is judged once
    report.warnings = list(dict.fromkeys(warnings))
    return report


def _batched_text_readers(configs: dict, folder_of: dict[str, str], entry: str) -> list[Problem]:
    """Python models that read the client's BYTES with Triton's dynamic batching on: the python backend validates
    every request's BYTES framing while it gathers a batch and fails the whole batch on one malformed request
    (docs/performance.md, fifty-eighth round), so one bad client request fails the requests batched with it."""
    entry_cfg = configs[entry]
    client_bytes = {t.name for t in entry_cfg.input if t.data_type == mc.TYPE_STRING}
    readers = [(folder_of.get(step.model_name), step.input_map) for step in entry_cfg.ensemble_scheduling.step] \
        if entry_cfg.platform == "ensemble" else [(entry, {name: name for name in client_bytes})]
    warnings = []
    for folder, input_map in readers:
        inputs = sorted(own for own, tensor in input_map.items() if tensor in client_bytes)
        cfg = configs.get(folder)  # None for a step no folder holds, which wiring_problems reports
        if inputs and cfg is not None and cfg.backend == "python" and cfg.HasField("dynamic_batching"):
            warnings.append(Problem(f"{folder}/config.pbtxt", "dynamic_batching",
                                    f"batches requests but reads the client's BYTES ({', '.join(inputs)}): Triton's "
                                    f"python backend fails every request of a batch when one has malformed BYTES "
                                    f"framing, so one bad client request fails its neighbours; remove "
                                    f"dynamic_batching unless every client is your own"))
    return warnings


def _no_environment_fix(manifest: dict | None) -> str | None:
    """What to do, by the manifest, where a python model has no environment: the local-only repository's tarball
    carries it; a build that packed none (one environment serves every python model, and some model imports what
    none carries) deploys as cpu or gpu."""
    if not manifest:
        return None
    if manifest.get("local_only"):
        return "this is the local-only repository: deploy its .tar.gz, which carries the environment"
    if "environment" in manifest and manifest["environment"] is None \
            and str((manifest.get("build") or {}).get("env")) == "True":
        return "the build packed no environment, as another of its models imports what none carries: deploy the " \
               "cpu or gpu target"
    return None


def _entry_point(label: str, top_dirs: list[str], top_files: list[str], configs: dict,
                 ensembles: list[str]) -> tuple[str | None, list[Problem]]:
    """The model the MME loads, and what stops it: a repository needs at least one model folder and exactly one
    entry point, the ensemble (when there are several folders) or the only model."""
    problems = []
    if "config.pbtxt" in top_files:
        problems.append(Problem("config.pbtxt", "path", "a config at the top of the repository: each model needs its "
                                                        "own folder, <name>/config.pbtxt with <name>/1/"))
    if not top_dirs:
        problems.append(Problem(label, "models", "no model folder (a folder with config.pbtxt and a version folder "
                                                 "such as 1/): nothing would load"))
    elif len(top_dirs) > 1 and not ensembles:
        problems.append(Problem(label, "ensemble", f"{len(top_dirs)} model folders but no ensemble; the MME "
                                                   f"loads the folder whose config says platform: \"ensemble\""))
    elif len(ensembles) > 1:
        problems.append(Problem(label, "ensemble", f"{len(ensembles)} ensembles ({', '.join(ensembles)}); an MME "
                                                   f"tarball needs exactly one"))
    if ensembles:
        return ensembles[0], problems
    return (next(iter(configs)) if len(configs) == 1 and len(top_dirs) == 1 else None), problems


def _config_problems(tree: Tree, folder: str, cfg) -> list[Problem]:
    """What Triton's own config validation refuses at load: tensors without a name, a data_type or dims, or with a
    dimension below -1 or 0, preferred batch sizes outside 1..max_batch_size, scheduling fields on an ensemble, a
    labels file or warmup data file that is not there."""
    config_path = f"{folder}/config.pbtxt"
    problems = []
    is_ensemble = cfg.platform == "ensemble"
    if cfg.max_batch_size < 0:
        problems.append(Problem(config_path, "max_batch_size", f"{cfg.max_batch_size}: must be 0 (no batching) or "
                                                               f"more"))
    if cfg.platform and cfg.platform not in PLATFORMS:
        problems.append(Problem(config_path, "platform", f"{cfg.platform!r} is not a platform Triton knows "
                                                         f"({', '.join(sorted(PLATFORMS))}); a backend goes in "
                                                         f"`backend`"))
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        for index, tensor in enumerate(tensors):
            if not tensor.name:
                problems.append(Problem(config_path, f"{kind}[{index}].name", "missing: every tensor must have a "
                                                                              "name"))
                continue
            if tensor.data_type == 0:  # TYPE_INVALID, also what an unset data_type reads as
                problems.append(Problem(config_path, f"{kind}[{tensor.name}].data_type",
                                        "missing: every tensor must give its data_type (e.g. TYPE_FP32)"))
            where = f"{kind}[{tensor.name}].dims"
            if not tensor.dims and not is_ensemble:
                problems.append(Problem(config_path, where, "missing: every tensor must give its dims ([1] for one "
                                                            "value)"))
            elif any(d < -1 or d == 0 for d in tensor.dims):
                problems.append(Problem(config_path, where, f"{list(tensor.dims)}: each dimension must be >= 1, or "
                                                            f"-1 for a variable size"))
    for size in cfg.dynamic_batching.preferred_batch_size:
        if not 1 <= size <= cfg.max_batch_size:  # Triton compares also when max_batch_size is 0
            problems.append(Problem(config_path, "dynamic_batching.preferred_batch_size",
                                    f"{size} is not between 1 and max_batch_size {cfg.max_batch_size}"))
    if is_ensemble:
        present = {"backend": bool(cfg.backend), "instance_group": bool(cfg.instance_group),
                   "dynamic_batching": cfg.HasField("dynamic_batching"), "model_warmup": bool(cfg.model_warmup)}
        problems.extend(Problem(config_path, name, "set on an ensemble, which Triton refuses (its steps set their own)")
                        for name, is_set in present.items() if is_set)
    named_files = [(folder, tensor.label_filename, f"output[{tensor.name}].label_filename", "labels file")
                   for tensor in cfg.output if tensor.label_filename]
    named_files += [(f"{folder}/{WARMUP_FOLDER}", warmup_input.input_data_file,
                     f"model_warmup[{warmup.name}].inputs[{name}].input_data_file", "warmup data file")
                    for warmup in cfg.model_warmup for name, warmup_input in sorted(warmup.inputs.items())
                    if warmup_input.input_data_file]
    for base, filename, where, what in named_files:
        path = posixpath.normpath(posixpath.join(base, filename))
        if filename.startswith("/") or path == ".." or path.startswith("../"):
            problems.append(Problem(config_path, where, f"{filename!r} leads outside the repository"))
        elif path not in tree.files:
            problems.append(Problem(path, where, f"missing: Triton reads the {what} when it loads the model"))
    return problems


def _model_problems(tree: Tree, folder: str, cfg, target: StubTarget, warnings: list[Problem],
                    no_env_fix: str | None, server: ServerPython) -> list[Problem]:
    problems = []
    config_path = f"{folder}/config.pbtxt"
    for sub in tree.children(folder)[0]:
        if not is_version_folder(sub) and sub not in NOT_VERSION_FOLDERS:
            warnings.append(Problem(f"{folder}/{sub}", "version", "not a version folder (a number without leading "
                                                                  "zeros): Triton ignores it"))
    versions = sorted(_versions(tree, folder))
    if not versions:
        problems.append(Problem(folder, "version", "no numeric version folder (e.g. 1/)"))
    elif not _policy_versions(cfg, set(versions)):
        problems.append(Problem(config_path, "version_policy", f"selects none of the version folders "
                                                               f"({', '.join(map(str, versions))}): Triton loads no "
                                                               f"version"))
    kind = cfg.platform or cfg.backend
    if not kind:
        problems.append(Problem(config_path, "backend", "neither platform nor backend is set"))
        return problems
    if kind == "ensemble":
        return problems  # its version folder is legitimately empty
    expected = (cfg.default_model_filename,) if cfg.default_model_filename else LOADED_FILES.get(kind)
    if cfg.backend and cfg.backend not in LOADED_FILES and (
            close := difflib.get_close_matches(cfg.backend, [k for k in LOADED_FILES if k not in PLATFORMS], n=1)):
        problems.append(Problem(config_path, "backend", f"{cfg.backend!r} is not a backend of the Triton "
                                                        f"container; did you mean {close[0]!r}?"))
        return problems
    runner_files = _runner_files(cfg) if cfg.backend == "python" else {}
    for version in versions:
        vdir = f"{folder}/{version}"
        sub, files = tree.children(vdir)
        if not sub and not files:
            problems.append(Problem(vdir, "version", "empty version folder"))
            continue
        problems.extend(_per_gpu_plan_problems(tree, vdir, cfg, expected))
        for key, filename in runner_files.items():
            if problem := _version_file_problem(tree, vdir, filename, f"parameters.{key}", RUNNER_FILE_MISSING):
                problems.append(problem)
        if expected is None:
            warnings.append(Problem(config_path, "backend", f"artifact of backend {kind!r} not checked"))
        elif not any(tree.exists(f"{vdir}/{name}") for name in expected):
            field_name = "default_model_filename" if cfg.default_model_filename else (
                "platform" if cfg.platform else "backend")
            missing = Problem(f"{vdir}/{expected[0]}", field_name,
                              f"missing: {kind} loads {' or '.join(expected)} from each version folder")
            if cfg.cc_model_filenames:
                warnings.append(Problem(missing.file, missing.field, f"missing: a GPU whose compute capability is "
                                                                     f"not in cc_model_filenames loads "
                                                                     f"{expected[0]}"))
            else:
                problems.append(missing)
    if cfg.backend == "python":
        problems.extend(_runner_parameter_problems(cfg, config_path))
        problems.extend(_env_problems(tree, folder, cfg, target, warnings, no_env_fix, server))
    return problems


def _versions(tree: Tree, folder: str) -> set[int]:
    return {int(sub) for sub in tree.children(folder)[0] if is_version_folder(sub)}


def _policy_versions(cfg, versions: set[int]) -> set[int]:
    """The versions Triton loads of those present, under the config's version_policy (default: the latest one)."""
    policy = cfg.version_policy
    if policy.HasField("specific"):
        return versions & set(policy.specific.versions)
    if policy.HasField("all"):
        return versions
    latest = policy.latest.num_versions if policy.HasField("latest") else 1
    return set(sorted(versions)[-latest:]) if latest > 0 else set()


RUNNER_FILE_PARAMETERS = ("artifact", "reference", "tokenizer")  # files tritonpack's runners open at initialize
RUNNER_FILE_MISSING = "missing: the python model opens this file from its version folder at load"


def _runner_files(cfg) -> dict[str, str]:
    """A portable runner's `artifact` (the ONNX, IR, TorchScript, graphdef or DALI file it runs), `reference` (what
    the encoder checks itself against) and `tokenizer` (a runner that reads text), by parameter: each must be in each
    version folder."""
    params = config_parameters(cfg)
    return {key: params[key] for key in RUNNER_FILE_PARAMETERS if params.get(key)}


def _runner_parameter_problems(cfg, config_path: str) -> list[Problem]:
    """An OpenVINO runner's precision parameter, judged as its session reads it at load."""
    params = config_parameters(cfg)
    if params.get("framework") != "openvino":
        return []
    problem = load_model_module("framework_runner", "openvino_session").precision_problem(params)
    return [Problem(config_path, "parameters.precision", problem)] if problem else []


def _version_file_problem(tree: Tree, vdir: str, filename: str, where: str, missing: str) -> Problem | None:
    """A file the config names for the version folder: it must be a plain name, and be there."""
    if "/" in filename or filename in ("", ".", ".."):
        return Problem(f"{vdir}/{filename}", where, "must name a file inside the version folder")
    if f"{vdir}/{filename}" not in tree.files:
        return Problem(f"{vdir}/{filename}", where, missing)
    return None


def _per_gpu_plan_problems(tree: Tree, vdir: str, cfg, expected) -> list[Problem]:
    """`cc_model_filenames`: Triton loads the file named for the GPU's compute capability instead of the default
    one, so each must exist in each version folder."""
    problems = []
    default = expected[0] if expected else "the default file"
    for cc, filename in sorted(cfg.cc_model_filenames.items()):
        where = f"cc_model_filenames[{cc}]"
        if not re.fullmatch(r"\d+\.\d+", cc):
            problems.append(Problem(f"{vdir}/{filename}", where, f"{cc!r} is not a compute capability such as 8.6"))
        else:
            missing = f"missing: a GPU of compute capability {cc} loads this file instead of {default}"
            if problem := _version_file_problem(tree, vdir, filename, where, missing):
                problems.append(problem)
    return problems


def env_member(folder: str, value: str) -> str | None:
    """The repository path an `EXECUTION_ENV_PATH` of model `folder` names (`$$TRITON_MODEL_DIRECTORY/…`); None when
    it leads outside the repository."""
    relative = value[len(MODEL_DIR_VAR) + 1:]
    resolved = posixpath.normpath(posixpath.join(folder, relative))
    if relative.startswith("/") or resolved == ".." or resolved.startswith("../"):
        return None
    return resolved


def _syntax_problems(error: SyntaxError, target: StubTarget, warnings: list[Problem]) -> list[Problem]:
    """A python model's source this interpreter cannot parse: Triton would fail to import it, unless the stub's Python
    is newer than this one (new syntax), where its imports go unchecked."""
    where, here = f"line {error.lineno}", f"{sys.version_info.major}.{sys.version_info.minor}"
    if target.python is not None and tuple(map(int, target.python.split("."))) > sys.version_info[:2]:
        warnings.append(Problem(error.filename, where, f"{error.msg}: not valid Python {here}, so its imports were "
                                                       f"not checked (the stub runs Python {target.python})"))
        return []
    return [Problem(error.filename, where, f"{error.msg}: Triton's python backend cannot import it")]


def _stdlib_problems(sources: dict[str, bytes], target: StubTarget) -> list[Problem]:
    """Standard modules the sources import that the stub's Python lacks (added after it, or removed)."""
    from tritonpack.components import module_imports
    from tritonpack.env import stdlib_lacks

    return [Problem(name, f"import {module}", f"the stub runs Python {target.python} ({target.source}), whose "
                                              f"standard library has no {module} ({why})")
            for name, source in sorted(sources.items()) for module in sorted(module_imports(source, target.python))
            if (why := stdlib_lacks(target.python, module))]


def _env_problems(tree: Tree, folder: str, cfg, target: StubTarget, warnings: list[Problem],
                  no_env_fix: str | None, server: ServerPython) -> list[Problem]:
    config_path = f"{folder}/config.pbtxt"
    where = f"parameters.{ENV_PARAMETER}"
    from tritonpack.env import required_modules

    sources = {n: t for n, t in tree.texts.items() if n.startswith(folder + "/") and n.endswith(".py")}
    try:
        needs = required_modules(sources, config_parameters(cfg), target.python)
    except SyntaxError as e:
        return _syntax_problems(e, target, warnings)
    if target.python and (absent := _stdlib_problems(sources, target)):
        return absent
    if ENV_PARAMETER not in cfg.parameters:
        if _numpy_major(server.numpy) >= 2 and stub_needs_numpy1(LOCAL_TRITON_RELEASE):
            return [Problem(config_path, where, f"not set, so the local Triton runs the model in this Python, whose "
                                                f"numpy {server.numpy} its python backend stub (Triton 2.51) "
                                                f"reads wrongly: every request would abort the stub; install numpy<2 "
                                                f"into this Python (`pip install 'numpy<2'`)")]
        needs = {module for module in needs if not server.has(module)}
        if not needs:
            return []
        from tritonpack.env import envs_covering

        if no_env_fix:
            fix = no_env_fix
        elif not envs_covering(needs)[1]:
            fix = "build the tarball with its environment (the default; drop --no-env)"
        else:
            fix = "no packed environment carries them (too large for an MME tarball): deploy the cpu or gpu target"
        return [Problem(config_path, where, f"not set, but the model imports {', '.join(sorted(needs))}, which the "
                                            f"Triton container's Python lacks (it has numpy only); {fix}")]
    value = cfg.parameters[ENV_PARAMETER].string_value
    if not value.startswith(MODEL_DIR_VAR + "/"):
        return [Problem(config_path, where, f"{value!r} must start with {MODEL_DIR_VAR}/ so the env travels "
                                            f"inside the repository")]
    resolved = env_member(folder, value)
    if resolved is None:
        return [Problem(config_path, where, f"{value!r} leads outside the repository")]
    if resolved not in tree.files:
        return [Problem(config_path, where, f"{value!r}: {resolved} does not exist")]
    env = tree.envs.get(resolved)
    if env is None:
        return [Problem(config_path, where, f"{resolved} is not a .tar.gz/.tgz/.tar packed environment")]
    if env.problems:
        return env.problems
    if env.python is None:
        return [Problem(resolved, "python", "cannot tell the env's Python version (no conda-meta/python-*.json, "
                                            "pyvenv.cfg or lib/pythonX.Y/)")]
    if target.python is None:
        warnings.append(Problem(resolved, "python", f"env has Python {env.python}; target Python unknown (no "
                                                    f"manifest.json; pass --container or --python)"))
    elif env.python != target.python:
        return [Problem(resolved, "python", f"env has Python {env.python} but the target's stub runs "
                                            f"{target.python} ({target.source})")]
    if "numpy" not in env.modules and not env.system_site_packages:
        return [Problem(resolved, "numpy", "missing: the python backend stub imports numpy from the packed "
                                           "environment; add numpy to it (envs/*/environment.yml)")]
    missing = needs - env.modules
    if missing:
        return [Problem(config_path, where, f"{resolved} lacks {', '.join(sorted(missing))}, which the model "
                                            f"imports")]
    numpy = env.distributions.get("numpy")
    if _numpy_major(numpy) >= 2 and target.container and stub_needs_numpy1(target.container):
        return [Problem(resolved, "numpy", f"env has numpy {numpy}, but the python backend stub of Triton container "
                                           f"{target.container} aborts with numpy 2: pin numpy<2 in "
                                           f"envs/*/environment.yml and rebuild")]
    return []


def _numpy_major(version: str | None) -> int:
    return int(re.match(r"\d+", version)[0]) if version else 0


def _manifest_problems(tree: Tree, manifest: dict, ensemble: str | None) -> list[Problem]:
    problems = []
    digests = manifest.get("sha256") or {}
    if not (isinstance(digests, dict) and all(isinstance(d, str) for d in digests.values())):
        return [Problem("manifest.json", "sha256", "not an object of file path → SHA-256 hex digest")]
    for name, digest in sorted(digests.items()):
        if name not in tree.files:
            problems.append(Problem(name, "sha256", "listed in manifest.json but missing"))
        elif tree.sha256.get(name) != digest:
            problems.append(Problem(name, "sha256", "differs from manifest.json (changed after the build)"))
    default = manifest.get("sagemaker_triton_default_model_name")
    if default and ensemble and default != ensemble:
        problems.append(Problem("manifest.json", "sagemaker_triton_default_model_name",
                                f"{default!r} is not the entry model {ensemble!r}"))
    return problems


