"""Ensemble wiring checks on parsed configs: every step's tensors exist, with equal dtypes and compatible dims.

Works on `ModelConfig` protos so it serves both the build (rendered specs) and `tritonpack check` (configs
read back from a folder or tarball).
"""

from __future__ import annotations

from collections.abc import Mapping

from tritonclient.grpc import model_config_pb2 as mc


def dims_compatible(a, b) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def _dtype(value: int) -> str:
    return mc.DataType.Name(value)


def wiring_problems(ensemble: mc.ModelConfig, models: Mapping[str, mc.ModelConfig]) -> list[tuple[str, str]]:
    """(field, reason) pairs; empty when the ensemble's steps fit together and fit the composing models."""
    problems: list[tuple[str, str]] = []
    # ensemble tensor name → (dtype, dims, producer) for the ensemble inputs and every step output
    produced = {t.name: (t.data_type, list(t.dims), "ensemble input") for t in ensemble.input}
    consumed: list[tuple[str, int, list[int], str]] = []
    for index, step in enumerate(ensemble.ensemble_scheduling.step):
        where = f"ensemble_scheduling.step[{index}] ({step.model_name})"
        model = models.get(step.model_name)
        if model is None:
            problems.append((where, f"model {step.model_name} is not in the repository"))
            continue
        if ensemble.max_batch_size > 0 and model.max_batch_size == 0:
            problems.append((where, f"{step.model_name} is not batched (max_batch_size 0) but the ensemble is"))
        elif ensemble.max_batch_size > model.max_batch_size > 0:
            problems.append((where, f"ensemble max_batch_size {ensemble.max_batch_size} exceeds "
                                    f"{step.model_name}'s {model.max_batch_size}"))
        inputs = {t.name: t for t in model.input}
        outputs = {t.name: t for t in model.output}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                problems.append((f"{where}.input_map[{model_input}]",
                                 f"{step.model_name} has no input {model_input} (has {sorted(inputs)})"))
                continue
            spec = inputs[model_input]
            consumed.append((tensor, spec.data_type, list(spec.dims), f"{where}.input_map[{model_input}]"))
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
            produced[tensor] = (spec.data_type, list(spec.dims), f"{step.model_name}.{model_output}")
    for tensor, dtype, dims, where in consumed:
        if tensor not in produced:
            problems.append((where, f"tensor {tensor} is neither an ensemble input nor any step's output"))
            continue
        p_dtype, p_dims, producer = produced[tensor]
        if p_dtype != dtype:
            problems.append((where, f"tensor {tensor}: {producer} gives {_dtype(p_dtype)}, needs {_dtype(dtype)}"))
        elif not dims_compatible(p_dims, dims):
            problems.append((where, f"tensor {tensor}: {producer} gives dims {p_dims}, needs {dims}"))
    for output in ensemble.output:
        if output.name not in produced:
            problems.append((f"output[{output.name}]", "no step produces this ensemble output"))
            continue
        p_dtype, p_dims, producer = produced[output.name]
        if p_dtype != output.data_type or not dims_compatible(p_dims, list(output.dims)):
            problems.append((f"output[{output.name}]", f"{producer} gives {_dtype(p_dtype)} {p_dims}, ensemble "
                                                       f"declares {_dtype(output.data_type)} {list(output.dims)}"))
    return problems
