"""Runs a real ONNX / TorchScript / TensorFlow artifact with its Python library (the `portable` target).

The config parameter `framework` names the session module beside this file (`<framework>_session.py`); the build
copies only that one into the model folder. With a `tokenizer` parameter the runner reads TEXT itself
(`text_requests.py`)."""

import importlib

import triton_python_backend_utils as pb_utils
from runner_batching import FrameworkRunnerModel


class TritonPythonModel(FrameworkRunnerModel):
    pb_utils = pb_utils

    def open_session(self, path, params):
        return importlib.import_module(f"{params['framework']}_session").open_session(path, params)
