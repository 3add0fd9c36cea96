"""`onnxruntime_onnx`: the ONNX Runtime backend's load-time validation (`ValidateInputs`, `ValidateOutputs`,
`CompareDimsSupported` in onnxruntime_backend/src), then one run of the graph with ONNX Runtime on the CPU."""

from __future__ import annotations

from tritonpack.check.deep.model import (
    DeepModel,
    Findings,
    compare_trial_outputs,
    dims_mismatch,
    error_text,
    shape_text,
    triton_type,
)

_ORT_NUMPY = {"float": "float32", "double": "float64", "string": "object"}


def _tensor_info(arg) -> tuple[str, tuple[int, ...]]:
    """(TYPE_*, shape with -1 for symbolic or unknown dimensions) of an ONNX Runtime NodeArg."""
    element = arg.type.removeprefix("tensor(").removesuffix(")")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
    return triton_type(_ORT_NUMPY.get(element, element)), shape


def check_onnxruntime(model: DeepModel, out: Findings) -> None:
    import onnxruntime as ort

    path = model.artifact / "model.onnx" if model.artifact.is_dir() else model.artifact
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own exception types for unreadable graphs
        out.load_fails("file", f"ONNX Runtime cannot load it: {error_text(e)}")
        return
    graph_inputs = {a.name: _tensor_info(a) for a in session.get_inputs()}
    initializers = {a.name: _tensor_info(a) for a in session.get_overridable_initializers()}
    graph_outputs = {a.name: _tensor_info(a) for a in session.get_outputs()}
    before = len(out.problems)
    expected = model.expected_input_count
    if len(graph_inputs) != expected:
        out.load_fails("input", f"configuration expects {expected} inputs, model provides {len(graph_inputs)}")
    feedable = {**graph_inputs, **initializers}
    for tensor in model.inputs:
        _check_tensor(model, out, "input", tensor, feedable)
    for tensor in model.outputs:
        _check_tensor(model, out, "output", tensor, graph_outputs)
    if len(out.problems) == before:
        _trial_run(model, out, session)


def _check_tensor(model: DeepModel, out: Findings, kind: str, tensor, graph: dict) -> None:
    where = f"{kind}[{tensor.name}]"
    if kind == "input" and model.max_batch_size != 0 and any(
            io.name == tensor.name and io.optional for io in model.config.input):
        out.load_fails(where, f"optional input '{tensor.name}' is not supported for models that support batching")
        return
    if tensor.name not in graph:
        out.load_fails(where, f"unexpected inference {kind} '{tensor.name}', allowed {kind}s are: "
                              f"{', '.join(sorted(graph))}")
        return
    data_type, shape = graph[tensor.name]
    if data_type != tensor.data_type:
        out.load_fails(f"{where}.data_type", f"configuration expects datatype {tensor.data_type} for {kind} "
                                             f"'{tensor.name}', model provides {data_type}")
    if tensor.ragged:
        if shape != (-1,):
            out.load_fails(f"{where}.allow_ragged_batch", f"configuration expects model provides input with shape "
                                                          f"[-1] for ragged input '{tensor.name}', model provides "
                                                          f"{shape_text(shape)}")
    elif not shape:  # a scalar: every configured dimension must be 1
        if any(d != 1 for d in tensor.dims):
            out.load_fails(f"{where}.dims", f"scalar tensor '{tensor.name}', should only provide 1 in the model "
                                            f"configuration when the model doesn't support batching")
    elif mismatch := dims_mismatch(shape, tensor, model.max_batch_size, exact=kind == "output"):
        out.load_fails(f"{where}.dims", f"tensor '{tensor.name}': {mismatch}")


def _trial_run(model: DeepModel, out: Findings, session) -> None:
    feeds = {t.name: model.sample(t) for t in model.inputs}
    names = [t.name for t in model.outputs]
    try:
        results = session.run(names, feeds)
    except Exception as e:  # noqa: BLE001 - any failure of the run is what the backend would answer
        out.request_fails("run", f"ONNX Runtime fails on inputs shaped from the config: {error_text(e)}")
        return
    compare_trial_outputs(model, out, {n: (r.shape, r.dtype.name) for n, r in zip(names, results)})
