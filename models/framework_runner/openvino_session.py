"""Run an ONNX file with OpenVINO on the CPU, as Triton's openvino backend would (`precision` bf16 or fp32)."""

from __future__ import annotations

import numpy as np

OPENVINO_PRECISION = {"fp32": "f32", "bf16": "bf16"}


def open_session(path: str, params: dict[str, str]):
    import openvino as ov

    config = {
        "INFERENCE_PRECISION_HINT": OPENVINO_PRECISION[params.get("precision", "fp32")],
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        # Several single-threaded instances share the cores; pinning would put them all on the first one.
        "ENABLE_CPU_PINNING": False,
    }
    threads = int(params.get("threads", "0"))
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", config)
    request = compiled.create_infer_request()
    input_names = [port.get_any_name() for port in compiled.inputs]
    outputs = [(port.get_any_name(), port) for port in compiled.outputs]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = request.infer({n: inputs[n] for n in input_names})  # copies out of the request's buffers
        return {name: result[port] for name, port in outputs}

    return run
