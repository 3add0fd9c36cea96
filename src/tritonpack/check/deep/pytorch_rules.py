"""`pytorch_libtorch`: the PyTorch backend's rules (pytorch_backend/src/pt/model_instance_state.cc).

At load it reads only `forward()`'s signature: the argument count must equal the config's inputs, and the config's
input names pick how tensors reach `forward()`: by argument name when every name is one, by `<name>__<index>` when
every name has that form, else by config order. Outputs are taken by `<name>__<index>`, else by config order.
TorchScript keeps no output shapes, so the backend checks outputs only at the first request: index and dtype; their
shapes it passes on unchecked. The trial run on the CPU shows all three.
"""

from __future__ import annotations

from tritonpack.check.deep.model import DeepModel, Findings, compare_trial_outputs, error_text, triton_type

TORCH_TYPES = frozenset({"TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64",
                         "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_BF16"})


def _index(name: str) -> int | None:
    """The index of a `<name>__<index>` tensor name as the backend parses it (after the first "__", digits or
    nothing, which reads as 0); None if the name has no such form."""
    _, sep, tail = name.partition("__")
    return int(tail or 0) if sep and (tail.isdigit() or not tail) else None


def input_positions(names: list[str], arguments: list[str]) -> tuple[str, dict[str, int]]:
    """(convention, {config input name: forward() argument index}) as the backend's GetNamingConvention decides."""
    if all(n in arguments for n in names):
        return "forward argument names", {n: arguments.index(n) for n in names}
    if all(_index(n) is not None for n in names):
        return "<name>__<index>", {n: _index(n) for n in names}
    return "config order", {n: i for i, n in enumerate(names)}


def output_positions(names: list[str]) -> tuple[str, dict[str, int]]:
    if all(_index(n) is not None for n in names):
        return "<name>__<index>", {n: _index(n) for n in names}
    return "config order", {n: i for i, n in enumerate(names)}


def check_pytorch(model: DeepModel, out: Findings) -> None:
    import torch

    try:
        module = torch.jit.load(str(model.artifact), map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError and others for files that are not TorchScript
        out.load_fails("file", f"torch.jit.load cannot load it: {error_text(e)}")
        return
    arguments = [a for a in module.forward.schema.arguments if a.type.kind() != "ClassType"]  # not `self`
    before = len(out.problems)
    _check_types(model, out)
    _check_fixed_devices(model, out, module)
    if len(arguments) == 1 and arguments[0].type.kind() == "DictType":  # the config's names are the keys
        if len(out.problems) == before:
            _trial_run(model, out, module, None, 1)
        return
    _check_signature(model, out, arguments)
    names = [a.name for a in arguments]
    convention, positions = input_positions([t.name for t in model.inputs], names)
    if len(out.problems) == before:
        _check_input_positions(model, out, convention, positions, names)
    if len(out.problems) == before:
        _trial_run(model, out, module, positions, len(arguments))


def _check_fixed_devices(model: DeepModel, out: Findings, module) -> None:
    """A graph that fixes a device (a trace records the one it ran on) fails where the backend runs it on another:
    bert_pt's model.pt traced on the CPU failed every request on a GPU (docs/performance.md, thirty-sixth round)."""
    from tritonpack.build.torchscript import fixed_devices

    devices, kinds = fixed_devices(module), model.instance_kinds
    what = f"its graph moves tensors to {', '.join(devices)} whatever device they are on (fixed when it was traced)"
    elsewhere = {kind for kind, device in (("KIND_GPU", "cpu"), ("KIND_CPU", "cuda")) if kind in kinds
                 and any(d.startswith(device) for d in devices)}
    if elsewhere:
        out.request_fails("file", f"{what}, so on {', '.join(sorted(elsewhere))} forward() fails with \"Expected all "
                                  f"tensors to be on the same device\"; export it again where it traces no device")
    elif devices and "KIND_AUTO" in kinds:
        out.warning("file", f"{what}: where Triton places it on another device (KIND_AUTO), forward() fails")


def _check_signature(model: DeepModel, out: Findings, arguments) -> None:
    if any(a.type.kind() == "DictType" for a in arguments[1:]):
        out.load_fails("input", "Multiple inputs of kind DictType were detected. Only a single input of type "
                                "Dict(str, Tensor) is supported.")
    elif bad := [a for a in arguments if a.type.kind() not in ("TensorType", "ListType")]:
        out.load_fails("input", f"An input of type '{bad[0].type}' was detected in the model. Only a single input "
                                f"of type Dict(str, Tensor) or input(s) of type Tensor are supported.")
    elif len(arguments) != model.expected_input_count:
        out.load_fails("input", f"configuration expects {model.expected_input_count} inputs, model provides "
                                f"{len(arguments)}")


def _check_types(model: DeepModel, out: Findings) -> None:
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        if not tensors:
            out.load_fails(kind, f"model configuration must contain at least one {kind}, none were specified.")
        for t in tensors:
            if t.data_type == "TYPE_STRING":
                if len(t.dims) + (model.max_batch_size > 0) > 1:
                    out.load_fails(f"{kind}[{t.name}].dims", f"Triton only supports 1 dimensional List of String as "
                                                             f"{kind} for '{t.name}'")
            elif t.data_type not in TORCH_TYPES:
                out.load_fails(f"{kind}[{t.name}].data_type", f"unsupported datatype {t.data_type} for {kind} "
                                                              f"'{t.name}'")


def _check_input_positions(model: DeepModel, out: Findings, convention: str, positions: dict[str, int],
                           arguments: list[str]) -> None:
    if convention != "config order":
        seen: dict[int, str] = {}
        for name, index in positions.items():
            if index >= len(arguments):
                out.request_fails(f"input[{name}]", f"input '{name}' names forward() argument {index}, but "
                                                    f"forward() takes {len(arguments)} tensors")
            elif index in seen:
                out.request_fails(f"input[{name}]", f"inputs '{seen[index]}' and '{name}' both name forward() "
                                                    f"argument {index}")
            seen.setdefault(index, name)
        return
    misplaced = [(n, i) for n, i in positions.items() if n in arguments and arguments.index(n) != i]
    for name, index in misplaced:
        out.request_fails(f"input[{name}]", f"the config's input names are neither all forward() argument names "
                                            f"nor all <name>__<index>, so the backend feeds inputs by config order: "
                                            f"'{name}' (config position {index}) reaches forward() argument "
                                            f"'{arguments[index]}', not '{name}'")
    if not misplaced:
        mapping = ", ".join(f"{n} → {arguments[i]}" for n, i in positions.items() if i < len(arguments))
        out.warning("input", f"names are neither forward() argument names ({', '.join(arguments)}) nor "
                             f"<name>__<index>: the backend feeds them by config order ({mapping})")


def _trial_run(model: DeepModel, out: Findings, module, positions: dict[str, int] | None, argc: int) -> None:
    import torch

    samples = {t.name: torch.from_numpy(model.sample(t)) for t in model.inputs if t.data_type != "TYPE_STRING"}
    samples.update({t.name: ["text"] for t in model.inputs if t.data_type == "TYPE_STRING"})
    try:
        with torch.inference_mode():
            if positions is None:
                result = module(samples)
            else:
                args = [None] * argc
                for name, index in positions.items():
                    args[index] = samples[name]
                result = module(*args)
    except Exception as e:  # noqa: BLE001 - whatever forward() raises is what the first request gets
        message = error_text(e)
        if "cuda" in message.lower():
            out.not_checked("run", f"forward() needs a CUDA device here ({message}); not run on the CPU")
        else:
            out.request_fails("run", f"forward() fails on inputs shaped from the config: {message}")
        return
    _compare_outputs(model, out, list(result) if isinstance(result, tuple) else [result])


def _compare_outputs(model: DeepModel, out: Findings, results: list) -> None:
    import torch

    convention, positions = output_positions([t.name for t in model.outputs])
    if convention == "config order" and len(model.outputs) > 1:
        out.warning("output", "names do not follow <name>__<index>: the backend takes outputs by config order")
    returned = {}
    for tensor in model.outputs:
        index = positions[tensor.name]
        if index >= len(results):
            out.request_fails(f"output[{tensor.name}]", f"The output {tensor.name} in the model configuration refers "
                                                        f"to an output index which doesn't exist. This model has "
                                                        f"{len(results)} outputs")
            continue
        value = results[index]
        if not isinstance(value, torch.Tensor):
            continue  # List[str]: its length is the batch, which the backend reads as is
        dtype = triton_type(str(value.dtype).removeprefix("torch."))
        if value.dim() == 0:
            out.request_fails(f"output[{tensor.name}]", f"output '{tensor.name}' is a scalar which is not supported.")
        elif dtype != tensor.data_type:
            out.request_fails(f"output[{tensor.name}].data_type", f"configuration expects datatype "
                                                                  f"{tensor.data_type} for output '{tensor.name}', "
                                                                  f"model provides {dtype}")
        else:
            returned[tensor.name] = (tuple(value.shape), str(value.dtype).removeprefix("torch."))
    compare_trial_outputs(model, out, returned, dtypes=False)
