"""`openvino`: the OpenVINO backend's load-time rules (openvino_backend/src/openvino.cc `ValidateInputs`,
`ValidateOutputs`, the instance constructor; openvino_utils.cc `CompareDimsSupported`, `doesMatch`).

The model (`model.xml`, or the ONNX file `default_model_filename` names) is read with OpenVINO's own reader.
The backend converts each input and output to the config's data type itself, so dtypes are not compared; it
reshapes the batch dimension to `max_batch_size`, and a dynamic model dimension matches any size.
"""

from __future__ import annotations

from tritonpack.check.deep.model import DeepModel, DimsRule, Findings, dims_mismatch, error_text

OPENVINO_DIMS = DimsRule(batch_must_be_dynamic=False, skip_batch_axis=True, config_wildcard=True,
                         model_wildcard_always=True)


def check_openvino(model: DeepModel, out: Findings) -> None:
    if model.instance_kinds - {"KIND_CPU", "KIND_AUTO"}:
        out.load_fails("instance_group.kind", "Triton OpenVINO backend supports only Kind CPU and AUTO")
    import openvino as ov

    try:
        network = ov.Core().read_model(str(model.artifact))
    except Exception as e:  # noqa: BLE001 - OpenVINO raises its own exception types for unreadable models
        out.load_fails("file", f"OpenVINO cannot read it: {error_text(e)}")
        return
    expected = model.expected_input_count
    if len(network.inputs) != expected:
        out.load_fails("input", f"configuration expects {expected} inputs, model provides {len(network.inputs)}")
    reshaped = (model.parameter("RESHAPE_IO_LAYERS") or "").lower() == "yes"  # ParseBoolParameter: "yes" only
    for kind, ports, tensors in (("input", network.inputs, model.inputs), ("output", network.outputs, model.outputs)):
        by_name = {port.get_any_name(): port for port in ports}
        for tensor in tensors:
            port = by_name.get(tensor.name)
            if port is None:
                out.load_fails(f"{kind}[{tensor.name}]", f"unexpected inference {kind} '{tensor.name}', allowed "
                                                         f"{kind}s are: {', '.join(sorted(by_name))}")
                continue
            if kind == "input" and reshaped:
                continue  # RESHAPE_IO_LAYERS: the backend reshapes the input to the config's dims
            if port.get_partial_shape().rank.is_dynamic:
                continue  # any rank: nothing to compare
            shape = tuple(d.get_length() if d.is_static else -1 for d in port.get_partial_shape())
            if mismatch := dims_mismatch(shape, tensor, model.max_batch_size, exact=kind == "output",
                                         rule=OPENVINO_DIMS):
                out.load_fails(f"{kind}[{tensor.name}].dims", f"tensor '{tensor.name}': {mismatch}")
