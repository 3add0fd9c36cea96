"""A small API-faithful stand-in for `triton_python_backend_utils`, for unit tests of model.py outside a server.

Only what our models use: Tensor, InferenceRequest inputs, InferenceResponse, TritonError with codes, Logger.
`tests/model_folders.py` loads model.py files with it (the `python_model` fixture).
"""

from __future__ import annotations

import types

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


def module() -> types.ModuleType:
    """This fake as a module object, to stand in for `triton_python_backend_utils`."""
    fake = types.ModuleType("triton_python_backend_utils")
    for name in ("TritonError", "Tensor", "InferenceRequest", "InferenceResponse", "Logger",
                 "get_input_tensor_by_name"):
        setattr(fake, name, globals()[name])
    return fake
