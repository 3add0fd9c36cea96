"""`tensorrt_plan`: the TensorRT backend's rules (tensorrt_backend/src/instance_state.cc, tensorrt_utils.cc/.h).

The instance kind is checked from the config alone. The plan itself is read only where the `tensorrt` package
imports and a CUDA GPU deserializes it: its I/O tensors (names, modes, dtypes, shapes) and optimization profiles
against the config. A plan is never executed here: it runs only on the TensorRT version and GPU architecture it
was built for (hence `cc_model_filenames`, one plan per compute capability).
"""

from __future__ import annotations

import numpy as np

from tritonpack.check.deep.model import DeepModel, DimsRule, Findings, dims_mismatch, shape_text, triton_type

TENSORRT_DIMS = DimsRule(batch_must_be_dynamic=False, config_wildcard=True)  # outputs compared like inputs


def check_plan(model: DeepModel, out: Findings) -> None:
    if "KIND_CPU" in model.instance_kinds:
        out.load_fails("instance_group.kind", "TensorRT backend supports only GPU device")
    try:
        import tensorrt as trt
    except ImportError:
        out.not_checked("file", "TensorRT is not installed here: the plan's bindings and profiles were not read and "
                                "it was not run (executing a plan needs TensorRT on a GPU of the architecture it was "
                                "built for)")
        return
    engine = _deserialize(trt, model, out)
    if engine is not None:
        _check_engine(trt, model, out, engine)


def _deserialize(trt, model: DeepModel, out: Findings):
    try:
        engine = trt.Runtime(trt.Logger(trt.Logger.ERROR)).deserialize_cuda_engine(model.artifact.read_bytes())
    except Exception as e:  # noqa: BLE001 - no CUDA device, or a runtime that cannot start
        out.not_checked("file", f"TensorRT could not start here ({e}); the plan was not read")
        return None
    if engine is None:
        out.load_fails("file", "TensorRT cannot deserialize the plan: built by another TensorRT version or for "
                               "another GPU architecture")
    return engine


def _check_engine(trt, model: DeepModel, out: Findings, engine) -> None:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
    inputs = [n for n in names if is_input[n]]
    if len(inputs) < len(model.inputs):
        out.load_fails("input", f"configuration expects {len(model.inputs)} inputs, model provides at most "
                                f"{len(inputs)}")
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        for tensor in tensors:
            where = f"{kind}[{tensor.name}]"
            if tensor.name not in is_input:
                out.load_fails(where, f"{kind} '{tensor.name}' not found (the plan's tensors: {', '.join(names)})")
                continue
            if is_input[tensor.name] != (kind == "input"):
                out.load_fails(where, f"{kind} '{tensor.name}' is expected to be an {kind} in model")
                continue
            data_type = triton_type(np.dtype(trt.nptype(engine.get_tensor_dtype(tensor.name))).name)
            if data_type != tensor.data_type:
                out.load_fails(f"{where}.data_type", f"unexpected datatype {data_type} for inference {kind} "
                                                     f"'{tensor.name}', expecting {tensor.data_type}")
            shape = tuple(engine.get_tensor_shape(tensor.name))
            if mismatch := dims_mismatch(shape, tensor, model.max_batch_size, exact=False, rule=TENSORRT_DIMS):
                out.load_fails(f"{where}.dims", f"tensor '{tensor.name}': {mismatch}")
            elif kind == "input":
                _check_profiles(model, out, engine, tensor)


def _check_profiles(model: DeepModel, out: Findings, engine, tensor) -> None:
    """Every optimization profile must admit the config's fixed dims (load); some profile must admit the largest
    batch the dynamic batcher may form (a larger batch finds no profile and its requests fail)."""
    full = tensor.full_shape(model.max_batch_size)
    largest = 0
    for index in range(engine.num_optimization_profiles):
        low, _, high = (tuple(s) for s in engine.get_tensor_profile_shape(tensor.name, index))
        largest = max(largest, high[0] if high else 0)
        for axis, (d, lo, hi) in enumerate(zip(full, low, high)):
            if d != -1 and not lo <= d <= hi:
                out.load_fails(f"input[{tensor.name}].dims", f"model configuration specified invalid shape for input "
                                                             f"'{tensor.name}': model expected the shape of dimension "
                                                             f"{axis} to be between {lo} and {hi} but received {d} "
                                                             f"(profile {index}: {shape_text(low)} to "
                                                             f"{shape_text(high)})")
    if model.max_batch_size > 0 and largest < model.max_batch_size:
        out.request_fails("max_batch_size", f"{model.max_batch_size}, but the plan's profiles accept batches of input "
                                            f"'{tensor.name}' up to {largest}: no optimization profile takes a "
                                            f"larger batch", which=f"batches above {largest}")
