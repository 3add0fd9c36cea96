"""Build an ensemble for a target into `dist/<name>-<target>/` and `dist/<name>-<target>.tar.gz`.

spec → build → repository: the recipe (tritonpack.ensembles) is rendered into model folders (tritonpack.assembly)
from artifacts that build/ produces through the cache; the wiring is checked; environments are attached; the
repository and its reproducible MME tarball are written with a manifest.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path

from tritonpack import ensembles
from tritonpack.assembly import assemble
from tritonpack.cache import ArtifactCache
from tritonpack.components import TARGETS
from tritonpack.containers import DEFAULT_CONTAINER, PYTHON_MINOR, container_python, environment_python
from tritonpack.contracts import IoNames
from tritonpack.env import attach_environment, manifest_fields
from tritonpack.envpack import with_bytecode
from tritonpack.errors import SpecError, ToolUnavailable
from tritonpack.repository import distinct_step_names, replace_folder, with_step_names, write_repository, write_tarball
from tritonpack.server import PYTHON_VERSION
from tritonpack.wiring import wiring_problems


@dataclass(frozen=True)
class BuildRequest:
    name: str
    target: str
    model: str | None = None  # text ensembles: local sentence-transformers folder or hub id
    weights: str | None = None  # image ensembles: local checkpoint
    fp16: bool = False
    model_format: str | None = None  # dali_inception: graphdef (default) | onnx
    # The MME tarball carries one packed environment for its python models, for the Python of `container` (a
    # Triton container release) or `env_python`; `env=False`: none (the server's Python must provide them).
    env: bool = True
    container: str | None = None  # None: DEFAULT_CONTAINER, where env_python may differ from its Python
    env_python: str | None = None
    io_names: IoNames | None = None  # rename the ensemble's public input and output (e.g. INPUT0:OUTPUT0)
    # TensorRT plans built elsewhere: (compute capability or "" for the default model.plan, path); gpu target only
    plans: tuple[tuple[str, str], ...] = ()
    dist: Path = Path("dist")
    # overrides of the recipe's serving settings for this target, e.g. (("dynamic_batching", "false"),)
    serving: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        recipe = ensembles.recipe(self.name)
        if self.target not in TARGETS:
            raise SpecError(f"unknown target {self.target!r}; one of {', '.join(TARGETS)}")
        object.__setattr__(self, "serving", tuple((str(k), str(v)) for k, v in dict(self.serving).items()))
        object.__setattr__(self, "plans", tuple((str(k), str(v)) for k, v in dict(self.plans).items()))
        if self.plans and self.target != "gpu":
            raise SpecError(f"--plan: TensorRT plans are for the gpu target, not {self.target}")
        for cc, path in self.plans:
            if cc and not re.fullmatch(r"\d+\.\d+", cc):
                raise SpecError(f"--plan {cc}={path}: write the compute capability as MAJOR.MINOR, e.g. --plan "
                                f"8.6={path}")
        if self.target not in recipe.targets:
            raise SpecError(f"{self.name} has no {self.target} target; it has {', '.join(recipe.targets)}")
        text = isinstance(recipe, ensembles.TextRecipe)
        other_kind = [option for option, value in ({"--weights": self.weights, "--model-format": self.model_format}
                                                   if text else {"--model": self.model}).items() if value is not None]
        if other_kind:
            takes = "--model, a sentence-transformers folder" if text else "--weights, a checkpoint file or folder"
            raise SpecError(f"{self.name} is {'a text' if text else 'an image'} ensemble: {other_kind[0]} is for "
                            f"{'image' if text else 'text'} ensembles ({self.name} takes {takes})")
        if self.weights is not None and not Path(self.weights).exists():
            raise SpecError(f"--weights {self.weights}: no such file or folder")
        if self.env_python is not None and not PYTHON_MINOR.fullmatch(self.env_python):
            raise SpecError(f"--env-python {self.env_python!r}: write the Python minor version, e.g. 3.10")
        # a malformed or unknown release, or one whose Python is not --env-python, is refused before anything is built
        environment_python(self.container, self.env_python, "--env-python")
        object.__setattr__(self, "container", self.container or DEFAULT_CONTAINER)  # what the manifest records

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.target}"


def build_record(request: BuildRequest) -> dict[str, str]:
    """What was asked, for the manifest. Local inputs are named by their file or folder name, so the tarball's bytes
    do not depend on where they lay or how the path was typed (nor carry the builder's home folder)."""
    def recorded(value):
        if isinstance(value, tuple):
            return tuple(recorded(v) for v in value)
        return Path(value).name if isinstance(value, str) and "/" in value and Path(value).exists() else value

    return {f.name: str(recorded(getattr(request, f.name))) for f in fields(request)
            if getattr(request, f.name) not in (None, False, ()) and f.name != "dist"}


@dataclass(frozen=True)
class BuildResult:
    repository: Path
    tarball: Path


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def portable_on_gpu_hint(request: BuildRequest) -> str | None:
    """One line for a portable build on a machine with a CUDA GPU, naming the serving settings its recipe measured
    faster there (`TextRecipe.portable_on_gpu`), unless the build already sets them."""
    recipe = ensembles.recipe(request.name)
    overrides = recipe.portable_on_gpu if isinstance(recipe, ensembles.TextRecipe) else ()
    if (request.target != "portable" or not overrides or dict(request.serving).keys() & dict(overrides)
            or not cuda_available()):
        return None
    settings = " ".join(f"--serving {key}={value}" for key, value in overrides)
    return (f"note: to serve {request.name} portable on this machine's GPU, build it with {settings} (1.43x the "
            f"defaults at 64 concurrent requests on an H200; README, \"Batching and instances\")")


def default_target() -> tuple[str, str]:
    """`gpu` where a CUDA GPU and TensorRT are both present, else `portable`; with the reason in one line."""
    gpu = cuda_available()
    try:
        import tensorrt  # noqa: F401

        trt = True
    except ImportError:
        trt = False
    if gpu and trt:
        return "gpu", "TARGET=gpu (CUDA GPU and TensorRT found)"
    missing = " and ".join(m for m, ok in (("a CUDA GPU", gpu), ("TensorRT", trt)) if not ok)
    return "portable", f"TARGET=portable ({missing} not found; set TARGET=cpu|gpu to choose)"


def build(request: BuildRequest) -> BuildResult:
    dist = Path(request.dist)
    dist.mkdir(parents=True, exist_ok=True)
    # staging first: an output folder we cannot write fails here, not after the artifacts are made (dist/cache, where
    # they go, may live elsewhere)
    with tempfile.TemporaryDirectory(prefix=f".{request.slug}-", dir=dist) as staging:
        return _build_staged(request, dist, Path(staging))


def _build_staged(request: BuildRequest, dist: Path, staging: Path) -> BuildResult:
    recipe = ensembles.recipe(request.name)
    cache = ArtifactCache(dist / "cache")
    try:
        folders = assemble(recipe, request, cache)
    except ToolUnavailable as e:  # say which targets build without the missing tool
        others = " or ".join(t for t in recipe.targets if t != request.target)
        raise ToolUnavailable(f"{e}; build {request.name} for {others} instead "
                              f"(make ensemble NAME={request.name} TARGET={others.split()[-1]})") from None
    configs = {f.spec.name: f.spec.to_proto() for f in folders}
    for config in configs.values():
        if config.platform == "ensemble":
            problems = wiring_problems(config, configs)
            if problems:
                raise SpecError(f"{request.slug}: " + "; ".join(f"{field}: {why}" for field, why in problems))
    manifest = {
        "ensemble": request.name,
        "target": request.target,
        "sagemaker_triton_default_model_name": request.name,
        "build": build_record(request),
        "built_with_python": PYTHON_VERSION,  # minor only: the tarball bytes must not depend on the patch level
    }
    # The local repository runs in this interpreter's environment (the bundled Triton's stub); the tarball carries
    # what the target container's Python lacks, its models' bytecode (`with_bytecode`) and step names of its own
    # (`distinct_step_names`). Both are made in staging and swapped in together at the end (`publish`).
    python = request.env_python or container_python(request.container)
    local = write_repository(folders, staging / "local", {**manifest, **manifest_fields(folders, None),
                                                          "local_only": True})
    plan = attach_environment(folders, cache, python=python) if request.env else None
    packed_folders = with_bytecode(plan.folders if plan else folders, python, staging / "bytecode")
    top_files = plan.top_files if plan else {}
    names = distinct_step_names(packed_folders, top_files)
    if plan:
        plan = replace(plan, users=[names.get(user, user) for user in plan.users])
    packed_folders = with_step_names(packed_folders, names)
    packed = write_repository(packed_folders, staging / request.slug,
                              {**manifest, **manifest_fields(packed_folders, plan)}, top_files, link=True)
    return publish(local, write_tarball(packed, staging / f"{request.slug}.tar.gz"), dist, request.slug)


def publish(repository: Path, tarball: Path, dist: Path, slug: str) -> BuildResult:
    """Move a build's repository and tarball to `dist/<slug>/` and `dist/<slug>.tar.gz`. The old tarball goes first:
    a build stopped here leaves no tarball beside a repository it was not built with (`check` would pass it)."""
    result = BuildResult(dist / slug, dist / f"{slug}.tar.gz")
    result.tarball.unlink(missing_ok=True)
    replace_folder(repository, result.repository)
    os.replace(tarball, result.tarball)
    return result
