"""`tritonpack check PATH`: will this repository folder or MME tarball load, and if not, why.

A tarball is read once, as a stream: the archive safety checks (`tritonpack.archive`) run on every member
before anything else looks at it, configs and manifest are kept in memory, every file is hashed, and packed
environments are inspected inside the stream. Nothing is extracted. A folder goes through the same checks.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format

from tritonpack.archive import ArchiveLimits, Problem, normalise_name, scan
from tritonpack.spec import parse_config
from tritonpack.wiring import wiring_problems

ENV_PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIR_VAR = "$$TRITON_MODEL_DIRECTORY"
MAX_MODELS_WITHOUT_WARNING = 5
ENV_SUFFIXES = (".tar.gz", ".tgz", ".tar")
TEXT_LIMIT = 4 << 20  # configs, manifests and model sources are small; larger ones are not read into memory
# The file each platform/backend loads from a version folder when `default_model_filename` is not set.
ARTIFACTS = {
    "onnxruntime_onnx": ("model.onnx",),
    "onnxruntime": ("model.onnx",),
    "pytorch_libtorch": ("model.pt",),
    "pytorch": ("model.pt",),
    "tensorflow_graphdef": ("model.graphdef",),
    "tensorflow_savedmodel": ("model.savedmodel",),
    "tensorrt_plan": ("model.plan",),
    "tensorrt": ("model.plan",),
    "dali": ("model.dali", "dali.py"),  # dali.py: DALI's @autoserialize, serialized by the backend at load
    "python": ("model.py",),
    "openvino": ("model.xml",),
}


@dataclass
class CheckReport:
    path: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    ensemble: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class EnvInfo:
    python: str | None
    problems: list[Problem]


@dataclass
class Tree:
    """What the checks need to know about a repository, read from a folder or a tar stream."""

    files: dict[str, int] = field(default_factory=dict)  # relative path → size
    dirs: set[str] = field(default_factory=set)
    texts: dict[str, bytes] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)
    envs: dict[str, EnvInfo] = field(default_factory=dict)

    def add_file(self, name: str, size: int) -> None:
        self.files[name] = size
        self.add_dir(posixpath.dirname(name))

    def add_dir(self, name: str) -> None:
        while name:
            self.dirs.add(name)
            name = posixpath.dirname(name)

    def children(self, folder: str) -> tuple[list[str], list[str]]:
        """(sub-folder names, file names) directly inside `folder` ("" for the top)."""
        prefix = f"{folder}/" if folder else ""
        subdirs = sorted({d[len(prefix):] for d in self.dirs if d.startswith(prefix) and "/" not in d[len(prefix):]})
        files = sorted(f[len(prefix):] for f in self.files if f.startswith(prefix) and "/" not in f[len(prefix):])
        return subdirs, files

    def exists(self, name: str) -> bool:
        return name in self.files or name in self.dirs


class _Hashing(io.RawIOBase):
    def __init__(self, f):
        self.f, self.digest = f, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read(len(b))
        b[:len(data)] = data
        self.digest.update(data)
        return len(data)

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        return self.digest.hexdigest()


_PYVENV_VERSION = re.compile(r"^\s*version(?:_info)?\s*=\s*(\d+)\.(\d+)", re.MULTILINE)
_CONDA_PYTHON = re.compile(r"^conda-meta/python-(\d+)\.(\d+)\.[^/]*\.json$")
_LIB_PYTHON = re.compile(r"^lib/python(\d+)\.(\d+)(/|$)")


def inspect_env(fileobj, label: str, limits: ArchiveLimits) -> EnvInfo:
    """The Python version a packed environment (conda-pack or venv-pack tarball) was built for, and its safety.

    Sources, best first: `conda-meta/python-X.Y.Z-*.json` (conda-pack), `pyvenv.cfg` (venv-pack), the
    `lib/pythonX.Y/` folder name (both).
    """
    found: dict[str, str] = {}

    def visit(member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        name = normalise_name(member.name)
        if m := _CONDA_PYTHON.match(name):
            found.setdefault("conda", f"{m[1]}.{m[2]}")
        elif name == "pyvenv.cfg" and member.isfile() and member.size < 65536:
            if m := _PYVENV_VERSION.search(tar.extractfile(member).read().decode("utf-8", "replace")):
                found.setdefault("pyvenv", f"{m[1]}.{m[2]}")
        elif m := _LIB_PYTHON.match(name):
            found.setdefault("lib", f"{m[1]}.{m[2]}")

    problems = [Problem(p.file if p.file == label else f"{label}:{p.file}", p.field, p.reason)
                for p in scan(fileobj, label, limits, visit, links_out=True)]
    python = found.get("conda") or found.get("pyvenv") or found.get("lib")
    return EnvInfo(python, problems)


def _keep_text(name: str, size: int) -> bool:
    base = posixpath.basename(name)
    return size <= TEXT_LIMIT and (base in ("config.pbtxt", "manifest.json") or base.endswith(".py"))


def read_tarball(path: Path, limits: ArchiveLimits) -> tuple[Tree, list[Problem]]:
    tree = Tree()

    def visit(member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        name = normalise_name(member.name)
        if not name:
            return
        if member.isdir():
            tree.add_dir(name)
            return
        tree.add_file(name, member.size)
        if not member.isfile():
            return
        reader = _Hashing(tar.extractfile(member))
        if _keep_text(name, member.size):
            tree.texts[name] = reader.read()
        elif name.endswith(ENV_SUFFIXES):
            tree.envs[name] = inspect_env(reader, name, limits)
        tree.sha256[name] = reader.drain()

    with open(path, "rb") as f:
        problems = scan(f, Path(path).name, limits, visit)
    return tree, problems


def read_folder(path: Path, limits: ArchiveLimits) -> tuple[Tree, list[Problem]]:
    tree, problems = Tree(), []
    root = Path(path)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath).relative_to(root).as_posix()
        base = "" if base == "." else base
        for d in list(dirnames):
            rel = posixpath.join(base, d) if base else d
            if (Path(dirpath) / d).is_symlink():
                problems.append(Problem(rel, "path", "a link; MME tarballs carry no links"))
                dirnames.remove(d)
            else:
                tree.dirs.add(rel)
        for filename in sorted(filenames):
            full = Path(dirpath) / filename
            rel = posixpath.join(base, filename) if base else filename
            if full.is_symlink():
                problems.append(Problem(rel, "path", "a link; MME tarballs carry no links"))
                continue
            if not full.is_file():
                problems.append(Problem(rel, "type", "not a regular file"))
                continue
            size = full.stat().st_size
            tree.add_file(rel, size)
            with open(full, "rb") as f:
                reader = _Hashing(f)
                if _keep_text(rel, size):
                    tree.texts[rel] = reader.read()
                elif rel.endswith(ENV_SUFFIXES):
                    tree.envs[rel] = inspect_env(reader, rel, limits)
                tree.sha256[rel] = reader.drain()
    return tree, problems


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


def target_python(manifest: dict | None, python: str | None, container: str | None) -> tuple[str | None, str]:
    """The Python minor the target server's stub runs, and where that came from."""
    if python:
        return python, "--python"
    if container:
        from tritonpack.env import container_python

        return container_python(container), f"Triton container {container}"
    if manifest and manifest.get("python_version"):
        return str(manifest["python_version"]), "manifest.json python_version"
    return None, ""


def check_tree(tree: Tree, label: str, python: str | None = None, container: str | None = None) -> CheckReport:
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
    py_target, py_source = target_python(manifest, python, container)

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
        problems.extend(_model_problems(tree, folder, cfg, py_target, py_source, warnings))
    report.models = sorted(configs)

    ensembles = sorted(name for name, cfg in configs.items() if cfg.platform == "ensemble")
    if len(top_dirs) > 1 and not ensembles:
        problems.append(Problem(label, "ensemble", f"{len(top_dirs)} model folders but no ensemble; the MME "
                                                   f"loads the folder whose config says platform: \"ensemble\""))
    elif len(ensembles) > 1:
        problems.append(Problem(label, "ensemble", f"{len(ensembles)} ensembles ({', '.join(ensembles)}); an MME "
                                                   f"tarball needs exactly one"))
    if ensembles:
        report.ensemble = ensembles[0]
    elif len(configs) == 1:
        report.ensemble = next(iter(configs))
    by_name = {cfg.name or folder: cfg for folder, cfg in configs.items()}
    for name in ensembles:
        for where, reason in wiring_problems(configs[name], by_name):
            problems.append(Problem(f"{name}/config.pbtxt", where, reason))
        used = {step.model_name for step in configs[name].ensemble_scheduling.step}
        for unused in sorted(set(configs) - used - {name}):
            warnings.append(Problem(f"{unused}/config.pbtxt", "name", f"not a step of ensemble {name}; it loads "
                                                                      f"but nothing calls it"))
    if len(top_dirs) > MAX_MODELS_WITHOUT_WARNING:
        warnings.append(Problem(label, "models", f"{len(top_dirs)} model folders (more than "
                                                 f"{MAX_MODELS_WITHOUT_WARNING}): each loads in every MME instance "
                                                 f"that serves this target, slowing cold starts"))
    if manifest is not None:
        problems.extend(_manifest_problems(tree, manifest, report.ensemble))
    return report


def _model_problems(tree: Tree, folder: str, cfg, py_target: str | None, py_source: str,
                    warnings: list[Problem]) -> list[Problem]:
    problems = []
    config_path = f"{folder}/config.pbtxt"
    subdirs, _ = tree.children(folder)
    versions = []
    for sub in subdirs:
        if sub.isdigit():
            versions.append(sub)
        else:
            problems.append(Problem(f"{folder}/{sub}", "version", "version folder names must be numbers"))
    if not versions:
        problems.append(Problem(folder, "version", "no numeric version folder (e.g. 1/)"))
    kind = cfg.platform or cfg.backend
    if not kind:
        problems.append(Problem(config_path, "backend", "neither platform nor backend is set"))
        return problems
    if kind == "ensemble":
        return problems  # its version folder is legitimately empty
    expected = (cfg.default_model_filename,) if cfg.default_model_filename else ARTIFACTS.get(kind)
    for version in versions:
        vdir = f"{folder}/{version}"
        sub, files = tree.children(vdir)
        if not sub and not files:
            problems.append(Problem(vdir, "version", "empty version folder"))
            continue
        if expected is None:
            warnings.append(Problem(config_path, "backend", f"artifact of backend {kind!r} not checked"))
        elif not any(tree.exists(f"{vdir}/{name}") for name in expected):
            field_name = "default_model_filename" if cfg.default_model_filename else (
                "platform" if cfg.platform else "backend")
            problems.append(Problem(f"{vdir}/{expected[0]}", field_name,
                                    f"missing: {kind} loads {' or '.join(expected)} from each version folder"))
    if cfg.backend == "python":
        problems.extend(_env_problems(tree, folder, cfg, py_target, py_source, warnings))
    return problems


def _env_problems(tree: Tree, folder: str, cfg, py_target: str | None, py_source: str,
                  warnings: list[Problem]) -> list[Problem]:
    config_path = f"{folder}/config.pbtxt"
    where = f"parameters.{ENV_PARAMETER}"
    if ENV_PARAMETER not in cfg.parameters:
        from tritonpack.env import required_modules

        sources = {n: t for n, t in tree.texts.items() if n.startswith(folder + "/") and n.endswith(".py")}
        needs = required_modules(sources, {k: v.string_value for k, v in cfg.parameters.items()})
        if needs:
            warnings.append(Problem(config_path, where, f"not set, but the model imports {', '.join(sorted(needs))}"
                                                        f"; the Triton container's Python has only numpy (build "
                                                        f"with --env, make ENV=1)"))
        return []
    value = cfg.parameters[ENV_PARAMETER].string_value
    if not value.startswith(MODEL_DIR_VAR + "/"):
        return [Problem(config_path, where, f"{value!r} must start with {MODEL_DIR_VAR}/ so the env travels "
                                            f"inside the model folder")]
    relative = value[len(MODEL_DIR_VAR) + 1:]
    resolved = posixpath.normpath(posixpath.join(folder, relative))
    if relative.startswith("/") or not resolved.startswith(folder + "/"):
        return [Problem(config_path, where, f"{value!r} leads outside the model folder {folder}/")]
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
    if py_target is None:
        warnings.append(Problem(resolved, "python", f"env has Python {env.python}; target Python unknown (no "
                                                    f"manifest.json; pass --container or --python)"))
    elif env.python != py_target:
        return [Problem(resolved, "python", f"env has Python {env.python} but the target's stub runs "
                                            f"{py_target} ({py_source})")]
    return []


def _manifest_problems(tree: Tree, manifest: dict, ensemble: str | None) -> list[Problem]:
    problems = []
    digests = manifest.get("sha256") or {}
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


def check(path: Path, limits: ArchiveLimits | None = None, python: str | None = None,
          container: str | None = None) -> CheckReport:
    """Problems (deployment would fail) and warnings of a repository folder or MME tarball."""
    path = Path(path)
    limits = limits or ArchiveLimits()
    if path.is_dir():
        tree, problems = read_folder(path, limits)
    elif path.is_file():
        tree, problems = read_tarball(path, limits)
        if problems:  # unsafe archives are not looked at any further
            return CheckReport(str(path), problems)
    else:
        return CheckReport(str(path), [Problem(str(path), "path", "no such file or folder")])
    report = check_tree(tree, path.name, python=python, container=container)
    report.path = str(path)
    report.problems[:0] = problems
    return report


def cmd_check(args) -> int:
    limits = ArchiveLimits(**{k: v for k, v in (("max_members", args.max_members),
                                                ("max_total_bytes", args.max_total_bytes)) if v})
    report = check(Path(args.path), limits, python=args.python, container=args.container)
    for problem in report.problems:
        print(problem)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if report.ok:
        print(f"ok: {args.path} is deployable ({len(report.models)} models, entry {report.ensemble})",
              file=sys.stderr)
        return 0
    print(f"{args.path}: {len(report.problems)} problem(s); not deployable", file=sys.stderr)
    return 1


def add_command(subparsers) -> None:
    c = subparsers.add_parser("check", help="will this repository folder or MME tarball load? (exit 0 if so)",
                              description="Checks configs, artifacts, ensemble wiring, packed environments and "
                                          "archive safety without extracting; one line per problem: "
                                          "file: field: reason.")
    c.add_argument("path", help="a repository folder or a .tar.gz")
    target = c.add_mutually_exclusive_group()
    target.add_argument("--container", help="Triton container version the target runs (e.g. 24.10); its Python "
                                            "must match the packed envs' (default: manifest.json's python_version)")
    target.add_argument("--python", help="the target stub's Python minor version, e.g. 3.10")
    c.add_argument("--max-members", type=int, help=f"archive entry limit (default {ArchiveLimits.max_members})")
    c.add_argument("--max-total-bytes", type=int,
                   help=f"archive unpacked size limit (default {ArchiveLimits.max_total_bytes})")
    c.set_defaults(func=cmd_check)
