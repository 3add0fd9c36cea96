"""What every backend's rules work on: one model version's artifact, its config's tensors, and the findings.

Shapes follow Triton's conventions: -1 is a dimension of any size; a batched model's full shape is
`[-1] + dims` (`max_batch_size` > 0). The dimension rules are those of each backend's `CompareDimsSupported`
(docs/backends.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from tritonpack.archive import Problem
from tritonpack.spec import NUMPY_DTYPES

TRITON_OF_NUMPY = {v: k for k, v in NUMPY_DTYPES.items()}
DYNAMIC_SIZE = 8  # what a -1 dimension becomes in the inputs of the trial run (tokens, pixels, elements)
TRIAL_BATCH = 2  # a batched model's trial run takes 2 rows: an artifact exported for batch 1 shows it


class TrialInputUnavailable(Exception):
    """An input the trial run cannot make (numpy has no bfloat16): the artifact is checked but not run."""


def triton_type(numpy_name: str) -> str:
    """TYPE_* of a numpy-style dtype name ("float32", "object"), or the name itself when Triton has none."""
    return TRITON_OF_NUMPY.get(numpy_name, numpy_name)


def shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class ConfigTensor:
    """An input or output as the config declares it; `dims` is `reshape.shape` when a reshape is given (what
    the backends compare with the model)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    ragged: bool = False

    @classmethod
    def of(cls, io) -> ConfigTensor:
        dims = tuple(io.reshape.shape) if io.HasField("reshape") else tuple(io.dims)
        ragged = bool(getattr(io, "allow_ragged_batch", False))
        return cls(io.name, mc.DataType.Name(io.data_type), dims, ragged)

    def full_shape(self, max_batch_size: int) -> tuple[int, ...]:
        return ((-1,) if max_batch_size > 0 else ()) + self.dims


@dataclass(frozen=True)
class DeepModel:
    """One version folder's artifact of a native model, with its config."""

    folder: str
    version: str
    artifact: Path  # on disk (the user's folder, or the temporary extraction of a tarball)
    config: mc.ModelConfig

    @property
    def label(self) -> str:
        return f"{self.folder}/{self.version}/{self.artifact.name}"

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size

    @property
    def inputs(self) -> tuple[ConfigTensor, ...]:
        return tuple(ConfigTensor.of(io) for io in self.config.input)

    @property
    def outputs(self) -> tuple[ConfigTensor, ...]:
        return tuple(ConfigTensor.of(io) for io in self.config.output)

    @property
    def expected_input_count(self) -> int:
        """Config inputs plus batch inputs, sequence controls and states: what the backends count against the
        model's inputs."""
        cfg = self.config
        count = len(cfg.input) + len(cfg.batch_input)
        if cfg.HasField("sequence_batching"):
            count += len(cfg.sequence_batching.control_input) + len(cfg.sequence_batching.state)
        return count

    @property
    def instance_kinds(self) -> set[str]:
        """Kinds of the instance groups; Triton's default (no group) is KIND_AUTO."""
        kinds = {mc.ModelInstanceGroup.Kind.Name(g.kind) for g in self.config.instance_group if g.count != 0}
        return kinds or {"KIND_AUTO"}

    def parameter(self, key: str) -> str | None:
        return self.config.parameters[key].string_value if key in self.config.parameters else None

    @property
    def trial_batch(self) -> int:
        """Rows in the trial run's batch (0: the model is not batched)."""
        return min(TRIAL_BATCH, self.max_batch_size) if self.max_batch_size > 0 else 0

    def sample(self, tensor: ConfigTensor) -> np.ndarray:
        """A batch for the trial run: `trial_batch` rows when batched, -1 dimensions of DYNAMIC_SIZE, ones (valid
        token ids, masks and segment ids alike; b"text" for strings). A ragged input reaches the model as the
        backends hand it over: the batch's elements concatenated into one flat tensor."""
        shape = tuple(DYNAMIC_SIZE if d == -1 else d for d in tensor.full_shape(self.max_batch_size))
        shape = (self.trial_batch,) + shape[1:] if self.trial_batch else shape
        if tensor.ragged:
            shape = (int(np.prod(shape)),)
        if tensor.data_type == "TYPE_STRING":
            return np.full(shape, b"text", dtype=object)
        if tensor.data_type in ("TYPE_BF16", "TYPE_INVALID"):
            raise TrialInputUnavailable(f"input '{tensor.name}' is {tensor.data_type}, which numpy cannot make: the "
                                        f"artifact was checked but not run")
        return np.ones(shape, dtype=NUMPY_DTYPES[tensor.data_type])


@dataclass
class Findings:
    """What the backend would answer about one artifact: problems (load or first request fails), warnings,
    and what could not be checked here."""

    label: str
    backend: str  # as the config names it: onnxruntime_onnx, pytorch_libtorch, dali, …
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    unchecked: list[Problem] = field(default_factory=list)

    def problem(self, where: str, reason: str) -> None:
        self.problems.append(Problem(self.label, where, reason))

    def load_fails(self, where: str, message: str) -> None:
        """`message`: what the backend answers when Triton loads the model, which then stays unavailable."""
        self.problem(where, f"{message.rstrip('.')}; {self.backend} refuses to load the model")

    def request_fails(self, where: str, message: str, which: str = "every request") -> None:
        """`message`: what the backend or framework answers to a request; the model loads."""
        self.problem(where, f"{message.rstrip('.')}; the model loads, then {self.backend} fails {which}")

    def warning(self, where: str, reason: str) -> None:
        self.warnings.append(Problem(self.label, where, reason))

    def not_checked(self, where: str, reason: str) -> None:
        self.unchecked.append(Problem(self.label, where, reason))

    def extend(self, other: Findings) -> None:
        self.problems += other.problems
        self.warnings += other.warnings
        self.unchecked += other.unchecked


@dataclass(frozen=True)
class DimsRule:
    """How one backend's CompareDimsSupported matches a model's shape with the config's; the defaults are ONNX
    Runtime's and TensorFlow's (docs/backends.md)."""

    batch_must_be_dynamic: bool = True  # batched: the model's first dimension must be -1
    skip_batch_axis: bool = False  # batched: the first dimension is not compared (OpenVINO reshapes it)
    config_wildcard: bool = False  # not exact: a config -1 accepts any model dimension
    model_wildcard_always: bool = False  # a dynamic model dimension matches even when exact


def dims_mismatch(model_shape: tuple[int, ...], tensor: ConfigTensor, max_batch_size: int, exact: bool,
                  rule: DimsRule = DimsRule()) -> str | None:
    """None when the config's shape fits the model's as the backend compares them, else the backend's reason.

    With `max_batch_size` > 0 the model's first dimension is the batch and the rest must match `dims`. `exact`
    (ONNX Runtime's outputs): a model -1 must be a config -1 too; otherwise a model -1 accepts any size."""
    batched = max_batch_size > 0
    if batched and (not model_shape or (rule.batch_must_be_dynamic and model_shape[0] != -1)):
        return (f"for the model to support batching the shape should have at least 1 dimension and the first "
                f"dimension must be -1; but shape expected by the model is {shape_text(model_shape)}")
    full = tensor.full_shape(max_batch_size)

    def compared(axis: int, model_dim: int, config_dim: int) -> bool:
        if batched and axis == 0 and rule.skip_batch_axis:
            return False
        if model_dim == -1 and (rule.model_wildcard_always or not exact):
            return False
        return not (config_dim == -1 and rule.config_wildcard and not exact)

    if len(model_shape) == len(full) and all(m == c for i, (m, c) in enumerate(zip(model_shape, full))
                                             if compared(i, m, c)):
        return None
    batch = ": the batch dimension of max_batch_size > 0, then dims" if batched else ""
    return (f"the model expects {len(model_shape)} dimensions (shape {shape_text(model_shape)}) but the model "
            f"configuration specifies {len(full)} dimensions (shape {shape_text(full)}{batch})")


def output_shape_mismatch(shape: tuple[int, ...], tensor: ConfigTensor, batch: int) -> str | None:
    """The shape a trial run of `batch` rows returned (0: not batched) against the config's; None when it fits.
    A batched model's first dimension must be the batch: the backend splits it into the requests' responses."""
    full = ((batch,) + tensor.dims) if batch else tensor.dims
    if len(shape) == len(full) and all(c in (-1, s) for s, c in zip(shape, full)):
        return None
    declared = shape_text(((-1,) if batch else ()) + tensor.dims)
    return f"the model returns shape {shape_text(shape)}{f' for a batch of {batch}' if batch else ''} but the " \
           f"config declares {declared}"


def error_text(error: BaseException) -> str:
    """One line of a framework's exception: its last non-empty line (TorchScript and TensorFlow put the cause
    last, after their own tracebacks), shortened."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[-1] if lines else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def compare_trial_outputs(model: DeepModel, out: Findings, returned: dict[str, tuple[tuple[int, ...], str]],
                          dtypes: bool = True) -> None:
    """Shapes (and with `dtypes`, dtypes) a trial run returned ({output name: (shape, numpy dtype name)}) against
    the config. Backends pass the returned shape on as it is, so a mismatch reaches the next ensemble step or the
    client."""
    for tensor in model.outputs:
        if tensor.name not in returned:
            continue
        shape, dtype = returned[tensor.name]
        if dtypes and triton_type(dtype) != tensor.data_type:
            out.problem(f"output[{tensor.name}].data_type", f"the model returns {triton_type(dtype)} but the config "
                                                            f"declares {tensor.data_type}")
        if mismatch := output_shape_mismatch(shape, tensor, model.trial_batch):
            batch = model.trial_batch
            consequence = ("the backend splits the first dimension into the batched requests' responses, so they "
                           "get wrong rows or fail" if batch and (not shape or shape[0] != batch) else
                           "Triton passes the returned shape on, so the next ensemble step or the client gets a "
                           "tensor the config does not declare")
            out.problem(f"output[{tensor.name}].dims", f"{mismatch}; {consequence}")
