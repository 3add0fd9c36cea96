"""Every framework tritonpack ships, in one table: its native Triton backend, the file that backend loads, and what
the `portable` python runner needs to run the same file.

Read by the model-folder renderer (components.py), `tritonpack check` (which file each backend loads) and the
environment planner (which module a python model imports, and which packed env provides it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class Framework:
    """`native`: the config fields that select the native backend; `filename`: what it loads from `1/`, and
    `companions` the files beside it that it reads too; `runner`: the `framework` parameter of the portable runner
    (None: no python runner); `module`: the library that runner imports; `precisions`: what the framework can be
    asked to compute in."""

    name: str
    native: Mapping[str, str]
    filename: str
    runner: str | None = None
    module: str | None = None
    precisions: tuple[str, ...] = ("fp32",)
    gpu: bool = True  # can run on the gpu target
    cpu: bool = True  # can run on the cpu target
    companions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "native", MappingProxyType(dict(self.native)))


FRAMEWORKS: Mapping[str, Framework] = MappingProxyType({f.name: f for f in (
    Framework("onnx", {"platform": "onnxruntime_onnx"}, "model.onnx", "onnxruntime", "onnxruntime"),
    # An ONNX file run by OpenVINO (Triton's openvino backend reads ONNX when told its file name). The portable
    # runner takes the IR below: the packed environment carries OpenVINO's IR reader only.
    Framework("openvino", {"backend": "openvino", "default_model_filename": "model.onnx"}, "model.onnx",
              module="openvino", precisions=("fp32", "bf16"), gpu=False),
    # OpenVINO's own format: the graph in model.xml, the weights (16 or 32 bits) in model.bin.
    Framework("openvino_ir", {"backend": "openvino"}, "model.xml", "openvino", "openvino",
              precisions=("fp32", "bf16"), gpu=False, companions=("model.bin",)),
    Framework("torchscript", {"platform": "pytorch_libtorch"}, "model.pt", "torchscript", "torch"),
    Framework("graphdef", {"platform": "tensorflow_graphdef"}, "model.graphdef", "tensorflow_graphdef",
              "tensorflow"),
    Framework("tensorrt_plan", {"platform": "tensorrt_plan"}, "model.plan", cpu=False),
)})
RUNNER_MODULES: Mapping[str, str] = MappingProxyType(
    {f.runner: f.module for f in FRAMEWORKS.values() if f.runner is not None})
DALI_MODULE = "nvidia"  # the portable DALI runner imports nvidia.dali
# The python backend's packed-environment parameter, and the variable Triton replaces with the model's folder.
ENV_PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIR_VAR = "$$TRITON_MODEL_DIRECTORY"

# The `platform` values Triton 2.51 takes (model_config_utils: anything else fails the load, "unexpected platform")
PLATFORMS = frozenset({"tensorrt_plan", "tensorflow_graphdef", "tensorflow_savedmodel", "onnxruntime_onnx",
                       "pytorch_libtorch", "ensemble"})
# What each platform or backend loads from a version folder when `default_model_filename` is not set (Triton's
# backends' READMEs), for configs that were not rendered here too (hand-written ones use aliases and savedmodels).
LOADED_FILES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    **{f.native["platform"]: (f.filename,) for f in FRAMEWORKS.values() if "platform" in f.native},
    "onnxruntime": ("model.onnx",),
    "pytorch": ("model.pt",),
    "tensorflow_savedmodel": ("model.savedmodel",),
    "tensorrt": ("model.plan",),
    "openvino": ("model.xml",),
    "dali": ("model.dali", "dali.py"),  # dali.py: DALI's @autoserialize, serialized by the backend at load
    "python": ("model.py",),
})


@dataclass(frozen=True)
class PackedEnvironment:
    """A packed environment (envs/<name>/environment.yml) and the top-level modules it provides beyond numpy."""

    name: str
    provides: frozenset[str]
    import_check: tuple[str, ...] = field(default=())  # imported after packing to prove it works


ENVIRONMENTS: Mapping[str, PackedEnvironment] = MappingProxyType({e.name: e for e in (
    PackedEnvironment("text", frozenset({"tokenizers"})),
    PackedEnvironment("onnx", frozenset({"onnxruntime"})),
    PackedEnvironment("openvino", frozenset({"openvino"})),
    PackedEnvironment("dali", frozenset({DALI_MODULE}), ("nvidia.dali", "nvidia.nvimgcodec")),
)})
