"""A small API-faithful stand-in for `triton_python_backend_utils`, for unit tests of model.py outside a server.

Only what our models use: Tensor, InferenceRequest inputs and response sender, InferenceResponse, TritonError with
codes, Logger.
`tests/model_folders.py` loads model.py files with it (the `python_model` fixture).
"""

from __future__ import annotations

import threading
import types

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


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


class InferenceResponseSender:
    """As the python backend's: one response with the FINAL flag for a model that is not decoupled; a send after the
    final one raises. `wait` (test only) returns what was sent once the final flag came."""

    def __init__(self):
        self.responses: list = []
        self._final = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        if self._final.is_set():
            raise TritonError("Unable to send response. Response sender has been closed.")
        if response is not None:
            self.responses.append(response)
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._final.set()

    def wait(self, timeout: float = 60.0):
        assert self._final.wait(timeout), "no final response"
        (response,) = self.responses
        return response


class InferenceRequest:
    def __init__(self, inputs: list[Tensor]):
        self._inputs = inputs
        self._sender = InferenceResponseSender()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def get_response_sender(self) -> InferenceResponseSender:
        return self._sender


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
                 "get_input_tensor_by_name", "TRITONSERVER_RESPONSE_COMPLETE_FINAL"):
        setattr(fake, name, globals()[name])
    return fake
