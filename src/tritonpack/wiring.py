"""Ensemble wiring checks on parsed configs, as Triton applies them when it loads an ensemble: every step's tensors
exist, with equal dtypes and shapes that agree, every ensemble input and every step output is read, and every pinned
step version is there.

Works on `ModelConfig` protos so it serves both the build (rendered specs) and `tritonpack check` (configs
read back from a folder or tarball).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from tritonclient.grpc import model_config_pb2 as mc

LATEST = -1  # a step's model_version that takes the model's latest version


def dims_compatible(a, b) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _dtype(value: int) -> str:
    return mc.DataType.Name(value)


def _shape(tensor, batched: bool, reshaped: bool = False) -> list[int]:
    """The tensor's full shape, as Triton compares ensemble tensors: the batch dimension first when its model batches
    (a non-batching step fits a batching ensemble when the shapes with it agree), and for the ensemble's own inputs
    and outputs the `reshape` shape when one is set."""
    dims = tensor.reshape.shape if reshaped and tensor.HasField("reshape") else tensor.dims
    return [-1] * batched + list(dims)


def wiring_problems(ensemble: mc.ModelConfig, models: Mapping[str, mc.ModelConfig],
                    versions: Mapping[str, Collection[int]] | None = None) -> list[tuple[str, str]]:
    """(field, reason) pairs; empty when the ensemble's steps fit together and fit the composing models. `versions`
    (model → its version folders) checks the steps' pinned versions too."""
    problems: list[tuple[str, str]] = []
    batched = ensemble.max_batch_size > 0
    # ensemble tensor name → (dtype, full shape, producer) for the ensemble inputs and every step output
    produced = {t.name: (t.data_type, _shape(t, batched, reshaped=True), "ensemble input") for t in ensemble.input}
    producer_field: dict[str, str] = {}
    consumed: list[tuple[str, int, list[int], str]] = []
    for index, step in enumerate(ensemble.ensemble_scheduling.step):
        where = f"ensemble_scheduling.step[{index}] ({step.model_name})"
        model = models.get(step.model_name)
        if model is None:
            problems.append((where, f"model {step.model_name} is not in the repository"))
            continue
        if versions is not None and step.model_version != LATEST \
                and step.model_version not in versions.get(step.model_name, ()):
            problems.append((f"{where}.model_version", f"version {step.model_version} of {step.model_name} has no "
                                                       f"folder (has {sorted(versions.get(step.model_name, ()))}); "
                                                       f"{LATEST} takes the latest"))
        if ensemble.max_batch_size > model.max_batch_size > 0:
            problems.append((where, f"ensemble max_batch_size {ensemble.max_batch_size} exceeds "
                                    f"{step.model_name}'s {model.max_batch_size}"))
        step_batched = model.max_batch_size > 0
        inputs = {t.name: t for t in model.input}
        outputs = {t.name: t for t in model.output}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                problems.append((f"{where}.input_map[{model_input}]",
                                 f"{step.model_name} has no input {model_input} (has {sorted(inputs)})"))
                continue
            spec = inputs[model_input]
            consumed.append((tensor, spec.data_type, _shape(spec, step_batched), f"{where}.input_map[{model_input}]"))
        missing = set(inputs) - set(step.input_map) - {t.name for t in model.input if t.optional}
        if missing:
            problems.append((f"{where}.input_map", f"inputs {sorted(missing)} of {step.model_name} are not mapped"))
        for model_output, tensor in step.output_map.items():
            if model_output not in outputs:
                problems.append((f"{where}.output_map[{model_output}]",
                                 f"{step.model_name} has no output {model_output} (has {sorted(outputs)})"))
                continue
            if tensor in produced:
                problems.append((f"{where}.output_map[{model_output}]", f"tensor {tensor} is produced twice"))
            spec = outputs[model_output]
            produced[tensor] = (spec.data_type, _shape(spec, step_batched), f"{step.model_name}.{model_output}")
            producer_field[tensor] = f"{where}.output_map[{model_output}]"
    for tensor, dtype, shape, where in consumed:
        if tensor not in produced:
            problems.append((where, f"tensor {tensor} is neither an ensemble input nor any step's output"))
            continue
        p_dtype, p_shape, producer = produced[tensor]
        if p_dtype != dtype:
            problems.append((where, f"tensor {tensor}: {producer} gives {_dtype(p_dtype)}, needs {_dtype(dtype)}"))
        elif not dims_compatible(p_shape, shape):
            problems.append((where, f"tensor {tensor}: {producer} gives shape {p_shape}, needs {shape}"))
    for output in ensemble.output:
        if output.name not in produced:
            problems.append((f"output[{output.name}]", "no step produces this ensemble output"))
            continue
        p_dtype, p_shape, producer = produced[output.name]
        shape = _shape(output, batched, reshaped=True)
        if p_dtype != output.data_type or not dims_compatible(p_shape, shape):
            problems.append((f"output[{output.name}]", f"{producer} gives {_dtype(p_dtype)} {p_shape}, ensemble "
                                                       f"declares {_dtype(output.data_type)} {shape}"))
    read = {tensor for tensor, *_ in consumed} | {t.name for t in ensemble.output}
    for tensor in ensemble.input:
        if tensor.name not in read:
            problems.append((f"input[{tensor.name}]", "no step reads this ensemble input (Triton refuses it)"))
    for tensor, where in producer_field.items():
        if tensor not in read:
            problems.append((where, f"tensor {tensor} is neither read by a step nor an ensemble output (Triton "
                                    f"refuses it)"))
    return problems
