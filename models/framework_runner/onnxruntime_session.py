"""Run an ONNX file with ONNX Runtime, as Triton's onnxruntime backend would."""

from __future__ import annotations

import numpy as np
from cpu_quota import cpu_limit


def open_session(path: str, params: dict[str, str]):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(params.get("threads", "0")) or cpu_limit() or 0  # 0: the library's default
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
    session = ort.InferenceSession(path, options, providers=providers)
    input_names = [i.name for i in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = session.run(output_names, {n: inputs[n] for n in input_names})
        return dict(zip(output_names, values))

    run.on_gpu = "CUDAExecutionProvider" in session.get_providers()
    return run
