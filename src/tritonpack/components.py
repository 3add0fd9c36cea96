"""Model folders: a spec plus the files that go beside its `config.pbtxt`, realised per target.

One ensemble definition renders every target: a framework artifact (ONNX, TorchScript, graphdef, TensorRT
plan, DALI pipeline) becomes the native backend on `gpu`/`cpu` and the python `framework_runner` running
the same file on `portable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tritonpack import CARD_ROOT
from tritonpack.spec import DynamicBatching, InstanceGroup, ModelSpec, SpecError, Tensor

MODELS_DIR = CARD_ROOT / "models"
TARGETS = ("gpu", "cpu", "portable")
VERSION = "1"


@dataclass(frozen=True)
class ModelFolder:
    spec: ModelSpec
    files: Mapping[str, Path] = field(default_factory=dict)  # path inside the model folder → source file

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", dict(self.files))
        if self.spec.labelled_output and "labels.txt" not in self.files:
            raise SpecError(f"model {self.spec.name}: labelled_output set but no labels.txt")


def instance_kind(target: str) -> str:
    return "KIND_GPU" if target == "gpu" else "KIND_CPU"


def python_model(spec: ModelSpec, source: str, extra_files: Mapping[str, Path] | None = None) -> ModelFolder:
    """A python-backend model from `models/<source>/`; the shared request helpers travel with it."""
    if spec.backend != "python":
        raise SpecError(f"model {spec.name}: python_model needs backend 'python'")
    modules = sorted((MODELS_DIR / source).glob("*.py")) + sorted((MODELS_DIR / "shared").glob("*.py"))
    files = {f"{VERSION}/{p.name}": p for p in modules}
    files.update(extra_files or {})
    return ModelFolder(spec, files)


@dataclass(frozen=True)
class Artifact:
    """A compiled model file and the framework that runs it.

    `openvino` is an ONNX file run by OpenVINO instead of ONNX Runtime; `precision` bf16 lets OpenVINO run
    matrix products in bfloat16 (on CPUs with native bf16, fp32 elsewhere). `packed`: the file takes several
    sentences as one sequence (models/framework_runner/packing.py), which only the portable runner feeds."""

    framework: str  # onnx | openvino | torchscript | graphdef | tensorrt_plan
    path: Path
    precision: str = "fp32"
    packed: bool = False

    NATIVE = {  # framework → (config fields naming the native backend, file name Triton looks for)
        "onnx": ({"platform": "onnxruntime_onnx"}, "model.onnx"),
        "openvino": ({"backend": "openvino", "default_model_filename": "model.onnx"}, "model.onnx"),
        "torchscript": ({"platform": "pytorch_libtorch"}, "model.pt"),
        "graphdef": ({"platform": "tensorflow_graphdef"}, "model.graphdef"),
        "tensorrt_plan": ({"platform": "tensorrt_plan"}, "model.plan"),
    }
    RUNNER = {"onnx": "onnxruntime", "openvino": "openvino", "torchscript": "torchscript",
              "graphdef": "tensorflow_graphdef"}
    PRECISIONS = {"onnx": ("fp32",), "openvino": ("fp32", "bf16"), "torchscript": ("fp32",),
                  "graphdef": ("fp32",), "tensorrt_plan": ("fp32",)}

    def __post_init__(self) -> None:
        if self.framework not in self.NATIVE:
            raise SpecError(f"unknown artifact framework {self.framework!r}")
        if self.precision not in self.PRECISIONS[self.framework]:
            raise SpecError(f"{self.framework} runs precision {' or '.join(self.PRECISIONS[self.framework])}, "
                            f"not {self.precision!r}")

    def native_parameters(self, threads: int) -> dict[str, str]:
        """Triton's openvino backend settings (its README, "Parameters"); other backends take none here."""
        if self.framework != "openvino":
            return {}
        params = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
        if threads:
            params["INFERENCE_NUM_THREADS"] = str(threads)
        if self.precision == "bf16":
            params["HINT_BF16"] = "YES"
        return params


def framework_model(
    name: str,
    artifact: Artifact,
    target: str,
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    max_batch_size: int,
    dynamic_batching: DynamicBatching | None,
    instances: int = 1,
    threads: int = 0,
    labels: Path | None = None,
    labelled_output: str = "",
    max_pack_tokens: int = 0,
    **native_options,
) -> ModelFolder:
    """The artifact on the native backend (gpu/cpu) or through the python framework_runner (portable).
    `max_pack_tokens`: for a packed artifact, how many real tokens the runner puts into one sequence."""
    if artifact.packed != (max_pack_tokens > 0):
        raise SpecError(f"model {name}: a packed artifact needs max_pack_tokens > 0, and only a packed one takes it")
    if artifact.packed and target != "portable":
        raise SpecError(f"model {name}: only the portable runner feeds a packed encoder; build {target} unpacked")
    backend_fields, filename = Artifact.NATIVE[artifact.framework]
    if artifact.framework == "torchscript":  # libtorch names outputs by position: <name>__<index>
        outputs = tuple(replace(t, name=f"{t.name}__{i}") for i, t in enumerate(outputs))
    extra = {"labels.txt": labels} if labels else {}
    if target == "portable":
        if artifact.framework not in Artifact.RUNNER:
            raise SpecError(f"{artifact.framework} has no portable runner; build {name} from its ONNX instead")
        params = {"framework": Artifact.RUNNER[artifact.framework], "artifact": filename,
                  "threads": str(threads)}
        if artifact.precision != "fp32":
            params["precision"] = artifact.precision
        if artifact.packed:
            params["max_pack_tokens"] = str(max_pack_tokens)
        if artifact.framework in ("torchscript", "graphdef"):  # the session needs the tensor names, in order
            params["input_order"] = ",".join(t.name for t in inputs)
            params["output_order"] = ",".join(t.name for t in outputs)
        # The runner pads the sequence axis across requests, so requests of different lengths batch together.
        ragged_inputs = tuple(replace(t, allow_ragged_batch=len(t.dims) > 0 and t.dims[0] == -1) for t in inputs)
        spec = ModelSpec(name=name, backend="python", max_batch_size=max_batch_size, inputs=ragged_inputs,
                         outputs=outputs, instance_group=(InstanceGroup("KIND_CPU", instances),),
                         dynamic_batching=dynamic_batching, parameters=params, labelled_output=labelled_output)
        return python_model(spec, "framework_runner", {f"{VERSION}/{filename}": artifact.path, **extra})
    if artifact.framework == "openvino" and target == "gpu":
        raise SpecError(f"model {name}: OpenVINO runs on the CPU; the gpu target takes onnx or tensorrt_plan")
    if artifact.framework == "tensorrt_plan" and target != "gpu":
        raise SpecError(f"model {name}: a TensorRT plan runs only on the gpu target")
    parameters = artifact.native_parameters(threads)
    spec = ModelSpec(name=name, max_batch_size=max_batch_size, inputs=inputs, outputs=outputs,
                     instance_group=(InstanceGroup(instance_kind(target), instances),),
                     dynamic_batching=dynamic_batching, labelled_output=labelled_output,
                     **({"parameters": parameters} if parameters else {}), **backend_fields, **native_options)
    return ModelFolder(spec, {f"{VERSION}/{filename}": artifact.path, **extra})


@dataclass(frozen=True)
class DaliPipeline:
    """A DALI pipeline in the two forms the targets need (build/serialize_dali.py writes both).

    `serialized`: `model.dali`, the CPU pipeline serialized at build time (cpu target and portable runner).
    `source`: `dali.py` with an `@autoserialize` GPU pipeline (mixed decoding), serialized by the DALI backend at
    load on the GPU server — a GPU pipeline cannot be serialized where CUDA is absent.
    """

    serialized: Path
    source: Path


def dali_model(
    name: str,
    pipeline: DaliPipeline,
    target: str,
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    max_batch_size: int,
    dynamic_batching: DynamicBatching | None = None,
    threads: int = 1,
    runner_parameters: Mapping[str, str] | None = None,
) -> ModelFolder:
    """The DALI backend (gpu: `1/dali.py`, KIND_GPU; cpu: `1/model.dali`, KIND_CPU) or, on portable, the python
    `dali_runner` running the same `model.dali` with DALI on the CPU. Encoded inputs differ in length from
    request to request, so they are ragged-batched. `runner_parameters` (e.g. `max_image_pixels`) configure the
    portable runner only: the native DALI backend has no such settings."""
    inputs = tuple(replace(t, allow_ragged_batch=True) for t in inputs)
    params = {"num_threads": str(threads)}
    if target == "portable":
        spec = ModelSpec(name=name, backend="python", max_batch_size=max_batch_size, inputs=inputs, outputs=outputs,
                         instance_group=(InstanceGroup("KIND_CPU", 1),), dynamic_batching=dynamic_batching,
                         parameters={**params, **(runner_parameters or {}), "artifact": "model.dali"})
        return python_model(spec, "dali_runner", {f"{VERSION}/model.dali": pipeline.serialized})
    file = ("dali.py", pipeline.source) if target == "gpu" else ("model.dali", pipeline.serialized)
    files = {f"{VERSION}/{file[0]}": file[1]}
    spec = ModelSpec(name=name, backend="dali", max_batch_size=max_batch_size, inputs=inputs, outputs=outputs,
                     instance_group=(InstanceGroup(instance_kind(target), 1),), dynamic_batching=dynamic_batching,
                     parameters=params)
    return ModelFolder(spec, files)
