"""Typed, frozen model specs rendered to Triton's `config.pbtxt` through its own protobuf schema.

Field names follow `model_config.proto` (snake_case) so a spec reads like the config it renders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonpack.errors import SpecError

DATA_TYPES = frozenset(mc.DataType.keys()) - {"TYPE_INVALID"}
KINDS = frozenset({"KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"})
# numpy dtype name of each Triton data type (TYPE_STRING travels as bytes objects)
NUMPY_DTYPES = {
    "TYPE_BOOL": "bool", "TYPE_UINT8": "uint8", "TYPE_UINT16": "uint16", "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64", "TYPE_INT8": "int8", "TYPE_INT16": "int16", "TYPE_INT32": "int32",
    "TYPE_INT64": "int64", "TYPE_FP16": "float16", "TYPE_FP32": "float32", "TYPE_FP64": "float64",
    "TYPE_BF16": "bfloat16", "TYPE_STRING": "object",
}


def _frozen_map(value: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(dict(value).items()))


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str
    dims: tuple[int, ...]
    allow_ragged_batch: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        if not self.name:
            raise SpecError("tensor name is empty")
        if self.data_type not in DATA_TYPES:
            raise SpecError(f"tensor {self.name}: unknown data_type {self.data_type!r}")
        if not self.dims or any(d < -1 or d == 0 for d in self.dims):
            raise SpecError(f"tensor {self.name}: dims must be positive or -1 (at least one), got {list(self.dims)}")

    def fill(self, msg) -> None:
        msg.name = self.name
        msg.data_type = mc.DataType.Value(self.data_type)
        msg.dims.extend(self.dims)
        if self.allow_ragged_batch:
            msg.allow_ragged_batch = True


@dataclass(frozen=True)
class InstanceGroup:
    kind: str = "KIND_CPU"
    count: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecError(f"instance_group kind {self.kind!r} is not one of {sorted(KINDS)}")
        if self.count < 1:
            raise SpecError(f"instance_group count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "preferred_batch_size", tuple(self.preferred_batch_size))
        if any(b < 1 for b in self.preferred_batch_size) or self.max_queue_delay_microseconds < 0:
            raise SpecError("dynamic_batching sizes must be >= 1 and the delay >= 0")


@dataclass(frozen=True)
class EnsembleStep:
    """`input_map` maps the step model's input name to an ensemble tensor; `output_map` its outputs."""

    model_name: str
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]
    model_version: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_map", _frozen_map(self.input_map))
        object.__setattr__(self, "output_map", _frozen_map(self.output_map))
        if not self.input_map or not self.output_map:
            raise SpecError(f"ensemble step {self.model_name}: input_map and output_map must not be empty")


@dataclass(frozen=True)
class WarmupInput:
    """Random data for one input of a warmup request (`model_warmup` in the config)."""

    name: str
    data_type: str
    dims: tuple[int, ...]

    def __post_init__(self) -> None:
        Tensor(self.name, self.data_type, self.dims)  # same validation rules


@dataclass(frozen=True)
class ModelWarmup:
    name: str
    batch_size: int
    inputs: tuple[WarmupInput, ...]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    max_batch_size: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    backend: str = ""
    platform: str = ""
    instance_group: tuple[InstanceGroup, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)
    default_model_filename: str = ""
    model_warmup: tuple[ModelWarmup, ...] = ()
    # name of the output whose classes `label_filename` names (the file is `labels.txt` in the model folder)
    labelled_output: str = ""
    # GPU compute capability ("8.6") → the file in each version folder Triton loads instead of the default on
    # such a GPU (TensorRT plans are specific to the architecture they were built for)
    cc_model_filenames: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("inputs", "outputs", "instance_group", "ensemble_steps", "model_warmup"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "parameters", _frozen_map(self.parameters))
        object.__setattr__(self, "cc_model_filenames", _frozen_map(self.cc_model_filenames))
        for cc, filename in self.cc_model_filenames:
            if not re.fullmatch(r"\d+\.\d+", cc) or not filename or "/" in filename or filename in (".", ".."):
                raise SpecError(f"model {self.name}: cc_model_filenames maps a compute capability such as '8.6' to a "
                                f"file name in the version folder, got {cc!r}: {filename!r}")
        if not self.name or "/" in self.name:
            raise SpecError(f"model name {self.name!r} is not a valid folder name")
        if bool(self.backend) == bool(self.platform) and self.platform != "ensemble":
            raise SpecError(f"model {self.name}: set exactly one of backend or platform")
        if self.max_batch_size < 0:
            raise SpecError(f"model {self.name}: max_batch_size must be >= 0")
        is_ensemble = self.is_ensemble
        if is_ensemble and not self.ensemble_steps:
            raise SpecError(f"ensemble {self.name} has no steps")
        if not is_ensemble and self.ensemble_steps:
            raise SpecError(f"model {self.name}: only an ensemble has ensemble_steps")
        if is_ensemble and (self.dynamic_batching or self.instance_group):
            raise SpecError(f"ensemble {self.name}: dynamic_batching and instance_group belong to its steps")
        if self.dynamic_batching and self.max_batch_size == 0:
            raise SpecError(f"model {self.name}: dynamic_batching needs max_batch_size > 0")
        if self.dynamic_batching and max(self.dynamic_batching.preferred_batch_size, default=0) > self.max_batch_size:
            raise SpecError(f"model {self.name}: preferred_batch_size {self.dynamic_batching.preferred_batch_size} "
                            f"exceeds max_batch_size {self.max_batch_size}")
        for group in (self.inputs, self.outputs):
            names = [t.name for t in group]
            if len(set(names)) != len(names):
                raise SpecError(f"model {self.name}: duplicate tensor names {names}")
        if self.labelled_output and self.labelled_output not in {t.name for t in self.outputs}:
            raise SpecError(f"model {self.name}: labelled_output {self.labelled_output} is not an output")

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble"

    def to_proto(self) -> mc.ModelConfig:
        cfg = mc.ModelConfig(name=self.name, max_batch_size=self.max_batch_size)
        if self.backend:
            cfg.backend = self.backend
        if self.platform:
            cfg.platform = self.platform
        if self.default_model_filename:
            cfg.default_model_filename = self.default_model_filename
        for tensor in self.inputs:
            tensor.fill(cfg.input.add())
        for tensor in self.outputs:
            out = cfg.output.add()
            tensor.fill(out)
            if tensor.name == self.labelled_output:
                out.label_filename = LABELS_FILENAME
        for group in self.instance_group:
            cfg.instance_group.add(kind=mc.ModelInstanceGroup.Kind.Value(group.kind), count=group.count)
        if self.dynamic_batching:
            cfg.dynamic_batching.preferred_batch_size.extend(self.dynamic_batching.preferred_batch_size)
            cfg.dynamic_batching.max_queue_delay_microseconds = (
                self.dynamic_batching.max_queue_delay_microseconds
            )
        for step in self.ensemble_steps:
            s = cfg.ensemble_scheduling.step.add(model_name=step.model_name, model_version=step.model_version)
            s.input_map.update(dict(step.input_map))
            s.output_map.update(dict(step.output_map))
        for key, value in self.parameters:
            cfg.parameters[key].string_value = value
        cfg.cc_model_filenames.update(dict(self.cc_model_filenames))
        for warmup in self.model_warmup:
            w = cfg.model_warmup.add(name=warmup.name, batch_size=warmup.batch_size)
            for inp in warmup.inputs:
                data = w.inputs[inp.name]
                data.data_type = mc.DataType.Value(inp.data_type)
                data.dims.extend(inp.dims)
                data.random_data = True
        return cfg

    def render(self) -> str:
        return render_config(self.to_proto())


LABELS_FILENAME = "labels.txt"


def render_config(cfg: mc.ModelConfig) -> str:
    text = text_format.MessageToString(cfg)
    if cfg.max_batch_size == 0:
        # proto3 omits zero scalars; Triton reads a missing max_batch_size as "not batched" too, but an
        # explicit line tells the reader the choice was deliberate.
        text = text.replace(f'name: "{cfg.name}"\n', f'name: "{cfg.name}"\nmax_batch_size: 0\n', 1)
    return text


def override_fields(settings, overrides):
    """A copy of the frozen dataclass `settings` with fields set from strings, as given on the command line
    (`--serving KEY=VALUE`): booleans take true/false/1/0, tuples comma- or space-separated integers, text fields
    the text (the settings class checks its values)."""
    values = {}
    for key, text in dict(overrides).items():
        if key not in settings.__dataclass_fields__:
            raise SpecError(f"unknown serving setting {key!r}; one of {', '.join(settings.__dataclass_fields__)}")
        current = getattr(settings, key)
        try:
            if isinstance(current, bool):
                if str(text).lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                values[key] = str(text).lower() in ("true", "1")
            elif isinstance(current, tuple):
                values[key] = tuple(int(v) for v in str(text).replace(",", " ").split())
            elif isinstance(current, str):
                values[key] = str(text)
            else:
                values[key] = int(text)
        except ValueError:
            kind = "true or false" if isinstance(current, bool) else "integers" if isinstance(current, tuple) else \
                "an integer"
            raise SpecError(f"serving setting {key} takes {kind}, got {text!r}") from None
    return replace(settings, **values)


def parse_config(text: str) -> mc.ModelConfig:
    """Parse a `config.pbtxt` with Triton's schema; raises `text_format.ParseError` naming line and field."""
    return text_format.Parse(text, mc.ModelConfig())


def config_parameters(cfg: mc.ModelConfig) -> dict[str, str]:
    """A config's `parameters` as plain strings (what a python model reads from `args["model_config"]`)."""
    return {key: value.string_value for key, value in cfg.parameters.items()}
