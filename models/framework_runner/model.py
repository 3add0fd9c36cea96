"""Runs a real ONNX / TorchScript / TensorFlow artifact with its Python library (the `portable` target)."""

import importlib

import triton_python_backend_utils as pb_utils
from runner_batching import FrameworkRunnerModel

SESSION_MODULES = {
    "onnxruntime": "onnxruntime_session",
    "openvino": "openvino_session",
    "torchscript": "torchscript_session",
    "tensorflow_graphdef": "graphdef_session",
}


class TritonPythonModel(FrameworkRunnerModel):
    pb_utils = pb_utils

    def open_session(self, path, params):
        return importlib.import_module(SESSION_MODULES[params["framework"]]).open_session(path, params)
