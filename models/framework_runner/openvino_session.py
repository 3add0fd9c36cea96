"""Run an ONNX file or an OpenVINO IR with OpenVINO on the CPU (`precision` bf16 or fp32).

One compiled model serves the whole process, with every CPU this process may run on (`os.sched_getaffinity`;
`threads` > 0 takes fewer): one OpenVINO stream (and infer request) per CPUS_PER_STREAM CPUs, at most MAX_STREAMS,
the threads shared out among them. `map` runs several inputs at once, one per idle request, so a runner that hands
it a batch as several packs keeps every stream busy from one process. The weights are held once, where one process
per core held them once per process (docs/performance.md: on 2 CPUs one stream of 2 threads used 6 % less CPU per
sentence than two single-threaded processes, and 13 % less than two streams, at less than half the memory), and in
16 bits where the file stores them so (`keep_weights_16bit`).
"""

from __future__ import annotations

import os
import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np

OPENVINO_PRECISION = {"fp32": "f32", "bf16": "bf16"}
CPUS_PER_STREAM = 4  # a stream's threads share each pack's matrix products; more streams run more packs at once
MAX_STREAMS = 4  # each stream keeps its own state per input shape (~15-35 MB on 2 CPUs, docs/performance.md)


def stream_layout(cpus: int, threads: int = 0, streams: int = 0) -> tuple[int, int]:
    """(streams, threads in all) for a process that may use `cpus` CPUs; `threads` > 0 caps the threads,
    `streams` > 0 sets the streams (the threads are shared out among them)."""
    threads = min(threads, cpus) if threads else cpus
    return min(streams or max(1, min(threads // CPUS_PER_STREAM, MAX_STREAMS)), threads), threads


def keep_weights_16bit(model) -> None:
    """Have OpenVINO's CPU plugin keep `model`'s fp16 matrix weights in 16 bits where it computes f32.

    The plugin widens fp16 FullyConnected weights inside its f32 kernels only in models it takes for LLMs (one
    with a ScaledDotProductAttention and a state variable); any other model gets them widened to f32 at the first
    inference, once per weight layout (two on AVX2, for short and for long packs). A state variable written from
    an attention over one 2×8 block makes the model qualify; no output depends on it. MiniLM: −40 MB per loaded
    model, the same embeddings bit for bit, the same speed (docs/performance.md, tenth round)."""
    import openvino as ov
    import openvino.opset13 as ops
    from openvino.op.util import Variable, VariableInfo

    block = ops.constant(np.zeros((1, 1, 2, 8), np.float32))
    info = VariableInfo()
    info.data_shape, info.data_type, info.variable_id = ov.PartialShape([1, 1, 2, 8]), ov.Type.f32, "weights_16bit"
    variable = Variable(info)
    model.add_variables([variable])
    model.add_sinks([ops.assign(ops.scaled_dot_product_attention(block, block, block, causal=False), variable)])


def read_model(core, path: str, precision: str):
    """The model at `path` as this process compiles it for OpenVINO `precision` (f32 | bf16) on this CPU."""
    model = core.read_model(path)
    computes_f32 = precision == "f32" or "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if computes_f32 and any(op.get_type_name() == "Constant" and op.get_element_type().get_type_name() == "f16"
                            for op in model.get_ops()):
        keep_weights_16bit(model)
    return model


class OpenVinoSession:
    """`session(inputs)` runs one call; `session.map([inputs, ...])` runs them `parallel` at a time, each on an
    idle infer request from a thread of its own (OpenVINO releases the GIL while it infers; an error comes back to
    the caller, where one in AsyncInferQueue's callback aborted the process)."""

    def __init__(self, path: str, params: dict[str, str]):
        import openvino as ov

        streams, threads = stream_layout(len(os.sched_getaffinity(0)), int(params.get("threads", "0")),
                                         int(params.get("streams", "0")))
        config = {
            "INFERENCE_PRECISION_HINT": OPENVINO_PRECISION[params.get("precision", "fp32")],
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": streams,
            "INFERENCE_NUM_THREADS": threads,
            # Other processes (the tokenizer, other models of an MME) share the cores: no thread owns one.
            "ENABLE_CPU_PINNING": False,
        }
        core = ov.Core()
        self.compiled = core.compile_model(read_model(core, path, config["INFERENCE_PRECISION_HINT"]), "CPU", config)
        self.computes = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # bf16 or f32 here
        self.parallel = streams
        self._idle = queue.SimpleQueue()
        for _ in range(streams):
            self._idle.put(self.compiled.create_infer_request())
        self._threads = ThreadPoolExecutor(streams, thread_name_prefix="openvino") if streams > 1 else None
        self._input_names = [port.get_any_name() for port in self.compiled.inputs]
        self._outputs = [(port.get_any_name(), port) for port in self.compiled.outputs]
        self._called = False

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        request = self._idle.get()
        try:
            result = request.infer({n: inputs[n] for n in self._input_names})  # copies out of the request
        finally:
            self._idle.put(request)
        self._called = True
        return {name: result[port] for name, port in self._outputs}

    def map(self, calls: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        if self._threads is None or len(calls) < 2:
            return [self(inputs) for inputs in calls]
        if not self._called:
            # The first call runs alone: two threads entering OpenVINO's Python bindings for the first time
            # deadlocked on the one-time initialisation of its numpy API (seen with gdb).
            return [self(calls[0])] + list(self._threads.map(self, calls[1:]))
        return list(self._threads.map(self, calls))


def open_session(path: str, params: dict[str, str]) -> OpenVinoSession:
    return OpenVinoSession(path, params)
