"""A small API-faithful stand-in for `triton_python_backend_utils`, for unit tests of model.py outside a server.

Only what our models use: Tensor, InferenceRequest inputs, InferenceResponse, TritonError with codes, Logger.
Model files are loaded under unique module names (every model file is called model.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
import uuid
from pathlib import Path

import numpy as np


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)

    def __init__(self, message: str, code: int = INTERNAL):
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceRequest:
    def __init__(self, inputs: list[Tensor]):
        self._inputs = inputs

    def inputs(self) -> list[Tensor]:
        return self._inputs


class InferenceResponse:
    def __init__(self, output_tensors=None, error: TritonError | None = None):
        self._outputs, self._error = list(output_tensors or []), error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class Logger:
    messages: list[tuple[str, str]] = []

    @classmethod
    def log_info(cls, msg):
        cls.messages.append(("info", msg))

    @classmethod
    def log_warn(cls, msg):
        cls.messages.append(("warn", msg))

    @classmethod
    def log_error(cls, msg):
        cls.messages.append(("error", msg))


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def _module() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    for name in ("TritonError", "Tensor", "InferenceRequest", "InferenceResponse", "Logger",
                 "get_input_tensor_by_name"):
        setattr(module, name, globals()[name])
    return module


def load_model(version_dir: Path, config_pbtxt: Path, model_repository: Path | None = None):
    """Import `version_dir/model.py` with this fake as triton_python_backend_utils; return an initialized model."""
    from google.protobuf import json_format

    from tritonpack.spec import parse_config

    sys.modules["triton_python_backend_utils"] = _module()
    config = json_format.MessageToDict(parse_config(config_pbtxt.read_text()), preserving_proto_field_name=True)
    # Like the stub, keep the version folder importable: models import siblings lazily in initialize.
    if str(version_dir) not in sys.path:
        sys.path.insert(0, str(version_dir))
    spec = importlib.util.spec_from_file_location(f"model_{uuid.uuid4().hex}", version_dir / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize({
        "model_config": json.dumps(config),
        "model_repository": str(model_repository or version_dir.parent),
        "model_version": version_dir.name,
        "model_name": config["name"],
    })
    return model
