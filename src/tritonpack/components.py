"""Model folders: a spec plus the files that go beside its `config.pbtxt`, realised per target.

A framework artifact (ONNX, TorchScript, graphdef, TensorRT plan) becomes its native backend on `gpu`/`cpu` and the
python `framework_runner` running the same file on `portable`; a DALI pipeline becomes the DALI backend or the
python `dali_runner`. Which backend runs which file comes from `tritonpack.backends`.
"""

from __future__ import annotations

import ast
import importlib
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

from tritonpack import CARD_ROOT
from tritonpack.backends import FRAMEWORKS, Framework
from tritonpack.errors import SpecError
from tritonpack.spec import LABELS_FILENAME, DynamicBatching, InstanceGroup, ModelSpec, Tensor

MODELS_DIR = CARD_ROOT / "models"
SHARED_DIR = MODELS_DIR / "shared"
TARGETS = ("gpu", "cpu", "portable")
VERSION = "1"
REFERENCE_FILENAME = "reference.npz"  # beside a portable runner's artifact: what it checks itself against at load
TOKENIZER_FILENAME = "tokenizer.json"  # a text model's tokenizer, copied into its version folder


@dataclass(frozen=True)
class ModelFolder:
    spec: ModelSpec
    files: Mapping[str, Path] = field(default_factory=dict)  # path inside the model folder → source file

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", dict(self.files))
        if self.spec.labelled_output and LABELS_FILENAME not in self.files:
            raise SpecError(f"model {self.spec.name}: labelled_output set but no {LABELS_FILENAME}")


def instance_kind(target: str) -> str:
    return "KIND_GPU" if target == "gpu" else "KIND_CPU"


# CPython 3.11's AST constructor keeps its recursion depth in interpreter-wide state: two threads parsing at once
# (the local MME checking two tarballs) can fail with "SystemError: AST constructor recursion depth mismatch"
_PARSE_LOCK = threading.Lock()


def module_imports(source: str | bytes, python: str | None = None) -> set[str]:
    """Top-level names a module imports anywhere in it: at import time, and inside functions, which a model's
    `initialize` or `execute` runs as surely. Raises SyntaxError where this interpreter cannot parse it, or, given
    `python` (X.Y), where it uses syntax newer than that Python (as far as `ast`'s `feature_version` tells)."""
    names: set[str] = set()
    grammar = tuple(map(int, python.split("."))) if python else None
    with _PARSE_LOCK:
        tree = ast.parse(source, feature_version=grammar)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def model_sources(source: str, dynamic: Iterable[str] = ()) -> dict[str, Path]:
    """`model.py` of `models/<source>/` and the sibling and shared modules it needs: those it imports, transitively,
    plus `dynamic` (modules it picks by name at run time). The stub puts the version folder on sys.path, so they
    travel beside model.py."""
    available = {p.stem: p for p in sorted(SHARED_DIR.glob("*.py"))}
    available.update({p.stem: p for p in sorted((MODELS_DIR / source).glob("*.py"))})
    wanted, found = ["model", *dynamic], {}
    while wanted:
        name = wanted.pop()
        if name in found:
            continue
        if name not in available:
            raise SpecError(f"models/{source}: module {name!r} is neither beside model.py nor in models/shared")
        found[name] = available[name]
        wanted += sorted(module_imports(found[name].read_bytes()) & set(available))
    return {f"{path.stem}.py": path for path in found.values()}


@contextmanager
def model_imports(source: str) -> Iterator[None]:
    """Import python-model code outside Triton: `models/<source>/` and `models/shared/` first on sys.path, as the stub
    has the version folder; afterwards sys.path is as it was and every module imported from models/ is gone from
    sys.modules (each model folder has its own `model.py`, siblings share names)."""
    saved, before = list(sys.path), set(sys.modules)
    sys.path[:0] = [str(MODELS_DIR / source), str(SHARED_DIR)]
    try:
        yield
    finally:
        sys.path[:] = saved
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(MODELS_DIR)):
                del sys.modules[name]


def load_model_module(source: str, module: str) -> ModuleType:
    """`models/<source>/<module>.py` (or a shared module), imported with its siblings (`model_imports`)."""
    with model_imports(source):
        return importlib.import_module(module)


def python_model(spec: ModelSpec, source: str, extra_files: Mapping[str, Path] | None = None,
                 dynamic_imports: Iterable[str] = ()) -> ModelFolder:
    """A python-backend model from `models/<source>/` with the modules it needs (`model_sources`)."""
    if spec.backend != "python":
        raise SpecError(f"model {spec.name}: python_model needs backend 'python'")
    files = {f"{VERSION}/{name}": path for name, path in model_sources(source, dynamic_imports).items()}
    return ModelFolder(spec, {**files, **(extra_files or {})})


@dataclass(frozen=True)
class Artifact:
    """A compiled model file and the framework that runs it (a `tritonpack.backends.FRAMEWORKS` key).

    `openvino` is an ONNX file run by OpenVINO instead of ONNX Runtime, `openvino_ir` OpenVINO's own format
    (`path` is its model.xml; model.bin beside it goes along); `precision` bf16 lets OpenVINO run
    matrix products in bfloat16 (on CPUs with native bf16, fp32 elsewhere). `packed`: the file takes several
    sentences as one sequence (models/framework_runner/packing.py), which only the portable runner feeds.
    `reference`: inputs and expected outputs the portable runner checks itself against at load (`reference.npz`,
    build/export_text_encoder.py `encoder_reference`), where the serving CPU picks the precision."""

    framework: str
    path: Path | None  # None: only `per_gpu` files
    precision: str = "fp32"
    packed: bool = False
    # TensorRT: compute capability ("8.6") → the plan built for that GPU architecture (`cc_model_filenames`)
    per_gpu: Mapping[str, Path] = field(default_factory=dict)
    reference: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_gpu", dict(self.per_gpu))
        if self.path is None and not self.per_gpu:
            raise SpecError(f"{self.framework} artifact: no file given")
        if self.per_gpu and self.framework != "tensorrt_plan":
            raise SpecError(f"{self.framework} artifact: only TensorRT plans come per GPU architecture")
        if self.framework not in FRAMEWORKS:
            raise SpecError(f"unknown artifact framework {self.framework!r}")
        if self.precision not in self.kind.precisions:
            raise SpecError(f"{self.framework} runs precision {' or '.join(self.kind.precisions)}, "
                            f"not {self.precision!r}")

    @property
    def kind(self) -> Framework:
        return FRAMEWORKS[self.framework]

    def files(self) -> dict[str, Path]:
        """The version folder's files: the artifact under its framework's file name and its companions, and a
        TensorRT plan per GPU architecture (`plan_filename`)."""
        files = {f"{VERSION}/{plan_filename(cc)}": path for cc, path in self.per_gpu.items()}
        if self.path is not None:
            files[f"{VERSION}/{self.kind.filename}"] = self.path
            files.update({f"{VERSION}/{name}": self.path.parent / name for name in self.kind.companions})
        return files

    def native_parameters(self, threads: int) -> dict[str, str]:
        """Triton's openvino backend settings (its README, "Parameters"); other backends take none here."""
        if self.kind.native.get("backend") != "openvino":
            return {}
        params = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
        if threads:
            params["INFERENCE_NUM_THREADS"] = str(threads)
        if self.precision == "bf16":
            params["HINT_BF16"] = "YES"
        return params


def plan_filename(compute_capability: str) -> str:
    """A per-architecture TensorRT plan's file in the version folder: `model_8_6.plan` for "8.6"."""
    return f"model_{compute_capability.replace('.', '_')}.plan"


def given_plans(plans: Mapping[str, Path]) -> Artifact:
    """TensorRT plans built elsewhere, on the GPUs they are for: key "" is the default `model.plan`, a compute
    capability ("8.6") a per-architecture plan listed in `cc_model_filenames`."""
    missing = [str(p) for p in plans.values() if not Path(p).is_file()]
    if missing:
        raise SpecError(f"--plan: no such file: {', '.join(missing)}")
    return Artifact("tensorrt_plan", Path(plans[""]) if "" in plans else None,
                    per_gpu={cc: Path(p) for cc, p in plans.items() if cc})


@dataclass(frozen=True)
class StepSettings:
    """How a step is served: batching, instances and threads (and, for a packed encoder, the tokens and sentences
    per pack). `labels`: the class names of the first output, for Triton's classification extension."""

    max_batch_size: int
    dynamic_batching: DynamicBatching | None
    instances: int = 1
    threads: int = 0
    max_pack_tokens: int = 0
    max_pack_rows: int = 0  # 0: no limit; a pooled export with sentence slots takes at most that many
    labels: Path | None = None
    index_rows: tuple[tuple[str, int], ...] = ()  # (input, rows of the table it indexes): ids past it are refused


def framework_model(name: str, artifact: Artifact, target: str, inputs: tuple[Tensor, ...],
                    outputs: tuple[Tensor, ...], settings: StepSettings, **native_options) -> ModelFolder:
    """The artifact on the native backend (gpu/cpu) or through the python framework_runner (portable)."""
    if artifact.packed != (settings.max_pack_tokens > 0):
        raise SpecError(f"model {name}: a packed artifact needs max_pack_tokens > 0, and only a packed one takes it")
    if artifact.packed and target != "portable":
        raise SpecError(f"model {name}: only the portable runner feeds a packed encoder; build {target} unpacked")
    kind = artifact.kind
    if artifact.framework == "torchscript":  # libtorch names outputs by position: <name>__<index>
        outputs = tuple(replace(t, name=f"{t.name}__{i}") for i, t in enumerate(outputs))
    extra = {LABELS_FILENAME: settings.labels} if settings.labels else {}
    common = dict(name=name, max_batch_size=settings.max_batch_size, outputs=outputs,
                  dynamic_batching=settings.dynamic_batching,
                  labelled_output=outputs[0].name if settings.labels else "")
    if target == "portable":
        if kind.runner is None:
            runs = ", ".join(f.name for f in FRAMEWORKS.values() if f.runner is not None)
            raise SpecError(f"model {name}: {artifact.framework} has no portable runner; the portable target runs "
                            f"{runs}")
        params = {"framework": kind.runner, "artifact": kind.filename, "threads": str(settings.threads)}
        if artifact.precision != "fp32":
            params["precision"] = artifact.precision
        if artifact.packed:
            params["max_pack_tokens"] = str(settings.max_pack_tokens)
            if settings.max_pack_rows:
                params["max_pack_rows"] = str(settings.max_pack_rows)
        if settings.index_rows:
            params["index_rows"] = ",".join(f"{name}:{rows}" for name, rows in settings.index_rows)
        if artifact.reference is not None:
            params["reference"] = REFERENCE_FILENAME
            extra = {**extra, f"{VERSION}/{REFERENCE_FILENAME}": artifact.reference}
        if artifact.framework in ("torchscript", "graphdef"):  # the session needs the tensor names, in order
            params["input_order"] = ",".join(t.name for t in inputs)
            params["output_order"] = ",".join(t.name for t in outputs)
        # The runner pads the sequence axis across requests, so requests of different lengths batch together.
        ragged_inputs = tuple(replace(t, allow_ragged_batch=len(t.dims) > 0 and t.dims[0] == -1) for t in inputs)
        spec = ModelSpec(backend="python", inputs=ragged_inputs, parameters=params,
                         instance_group=(InstanceGroup("KIND_CPU", settings.instances),), **common)
        return python_model(spec, "framework_runner", {**artifact.files(), **extra},
                            dynamic_imports=(f"{kind.runner}_session",))
    if not (kind.gpu if target == "gpu" else kind.cpu):
        raise SpecError(f"model {name}: {artifact.framework} does not run on the {target} target")
    parameters = artifact.native_parameters(settings.threads)
    per_gpu = {cc: plan_filename(cc) for cc in artifact.per_gpu}
    spec = ModelSpec(inputs=inputs, instance_group=(InstanceGroup(instance_kind(target), settings.instances),),
                     **({"parameters": parameters} if parameters else {}), **dict(kind.native), **common,
                     cc_model_filenames=per_gpu, **native_options)
    return ModelFolder(spec, {**artifact.files(), **extra})


def reading_text(runner: ModelFolder, text: Tensor, tokenizer: Path, parameters: Mapping[str, str],
                 batch_requests: bool) -> ModelFolder:
    """A portable framework runner that takes `text` instead of token tensors and tokenizes each request itself with
    `tokenizer` (a `tokenizer.json`; `parameters`: the tokenizer step's), batching requests on its own
    (models/framework_runner/text_requests.py): Triton's batcher is off, since the step reading client bytes must
    get one request at a time."""
    token_inputs = ",".join(t.name for t in runner.spec.inputs)
    spec = replace(runner.spec, inputs=(text,), dynamic_batching=None,
                   parameters={**dict(runner.spec.parameters), **parameters, "tokenizer": TOKENIZER_FILENAME,
                               "token_inputs": token_inputs, "batch_requests": str(batch_requests).lower()})
    sources = model_sources("framework_runner", ("text_requests",))
    files = {**runner.files, **{f"{VERSION}/{name}": path for name, path in sources.items()}}
    return ModelFolder(spec, {**files, f"{VERSION}/{TOKENIZER_FILENAME}": tokenizer})


@dataclass(frozen=True)
class DaliPipeline:
    """A DALI pipeline in the two forms the targets need (build/serialize_dali.py writes both).

    `serialized`: `model.dali`, the CPU pipeline serialized at build time (cpu target and portable runner).
    `source`: `dali.py` with an `@autoserialize` GPU pipeline (mixed decoding), serialized by the DALI backend at
    load on the GPU server — a GPU pipeline cannot be serialized where CUDA is absent.
    """

    serialized: Path
    source: Path


def dali_model(name: str, pipeline: DaliPipeline, target: str, inputs: tuple[Tensor, ...],
               outputs: tuple[Tensor, ...], settings: StepSettings,
               runner_parameters: Mapping[str, str] | None = None) -> ModelFolder:
    """The DALI backend (gpu: `1/dali.py`, KIND_GPU; cpu: `1/model.dali`, KIND_CPU) or, on portable, the python
    `dali_runner` running the same `model.dali` with DALI on the CPU. Encoded inputs differ in length from
    request to request, so they are ragged-batched. `runner_parameters` (e.g. `max_image_pixels`) configure the
    portable runner only: the native DALI backend has no such settings."""
    common = dict(name=name, max_batch_size=settings.max_batch_size, outputs=outputs,
                  inputs=tuple(replace(t, allow_ragged_batch=True) for t in inputs),
                  dynamic_batching=settings.dynamic_batching)
    params = {"num_threads": str(settings.threads)}
    if target == "portable":
        spec = ModelSpec(backend="python", instance_group=(InstanceGroup("KIND_CPU", 1),),
                         parameters={**params, **(runner_parameters or {}), "artifact": "model.dali"}, **common)
        return python_model(spec, "dali_runner", {f"{VERSION}/model.dali": pipeline.serialized})
    filename, path = ("dali.py", pipeline.source) if target == "gpu" else ("model.dali", pipeline.serialized)
    spec = ModelSpec(backend="dali", instance_group=(InstanceGroup(instance_kind(target), 1),), parameters=params,
                     **common)
    return ModelFolder(spec, {f"{VERSION}/{filename}": path})
