"""Structural checks of a KServe v2 inference request body, for front-ends that sit before tritonserver.

Triton 2.51's HTTP front-end answers some malformed bodies with 500 (a body that is not JSON, JSON without
`inputs`, a negative shape, an `Inference-Header-Content-Length` shorter than the JSON) and accepts others
it should refuse (an empty body; a dimension of 2**32 or more wraps around). A gateway (the local MME)
calls `infer_request_problem` first and answers 400 with the reason; everything else — names, dtypes,
ranks, batch size, element counts against the model's config — Triton itself answers with 400.

Pure standard library; see README, "Reliability".
"""

from __future__ import annotations

import json
import math

from tritonpack.codec import HEADER_LENGTH

MAX_PAYLOAD_BYTES = 6 * 1024 * 1024  # SageMaker real-time InvokeEndpoint's limit on a request body
MAX_DIM = 2**31 - 1  # Triton keeps dims as int64 but wraps batch sizes at 2**32
MAX_ELEMENTS = 2**31 - 1


def infer_request_problem(body: bytes, header_length: str | None = None,
                          header_field: str = HEADER_LENGTH) -> str | None:
    """Why `body` (with the length of its JSON part, if any, from the field the messages name) is not a well-formed
    v2 request; None when it is."""
    if not body:
        return "empty request body (expected a KServe v2 JSON request)"
    if header_length is None:
        json_part, binary_size = body, 0
    else:
        try:
            length = int(str(header_length).strip())
        except ValueError:
            return f"{header_field} {header_length!r} is not an integer"
        if not 0 < length <= len(body):
            return f"{header_field} {length} is outside the body's {len(body)} bytes"
        json_part, binary_size = body[:length], len(body) - length
    try:  # as Triton's parser reads it: UTF-8, a byte-order mark allowed (json.loads also takes UTF-16 and -32)
        request = json.loads(json_part.decode("utf-8-sig"), object_pairs_hook=_without_repeated_keys)
    except RepeatedKey as e:
        return str(e)
    except (UnicodeDecodeError, ValueError) as e:
        return f"request header is not JSON: {e}"
    except RecursionError:
        return "request header is JSON nested too deeply"
    if not isinstance(request, dict):
        return f"request must be a JSON object, got {type(request).__name__}"
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        return "request needs a non-empty 'inputs' list"
    declared_binary = 0
    for i, tensor in enumerate(inputs):
        problem, size = _input_problem(tensor, binary_size > 0, header_field)
        if problem:
            return f"inputs[{i}]: {problem}"
        declared_binary += size
    if declared_binary != binary_size:
        return f"inputs declare {declared_binary} binary bytes but the body carries {binary_size}"
    outputs = request.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                for o in outputs):
        return "'outputs' must be a list of objects with a 'name'"
    if not isinstance(request.get("parameters", {}), dict):
        return "'parameters' must be an object"
    return None


class RepeatedKey(ValueError):
    pass


def _without_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are all distinct. Triton reads the first of two equal keys and json.loads the last:
    a `shape` repeated with a small one after a huge one passed this check, and Triton reserved the huge one."""
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise RepeatedKey(f"request header repeats the key {key!r} in one object")
        found[key] = value
    return found


def _input_problem(tensor, has_binary: bool, header_field: str) -> tuple[str | None, int]:
    if not isinstance(tensor, dict):
        return "must be an object", 0
    if not isinstance(tensor.get("name"), str) or not tensor["name"]:
        return "needs a 'name' string", 0
    if not isinstance(tensor.get("datatype"), str):
        return "needs a 'datatype' string", 0
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d <= MAX_DIM for d in shape):
        return f"'shape' must be a list of integers in [0, {MAX_DIM}], got {str(shape)[:80]}", 0
    if math.prod(shape) > MAX_ELEMENTS:
        return f"shape {shape} has more than {MAX_ELEMENTS} elements", 0
    parameters = tensor.get("parameters", {})
    if not isinstance(parameters, dict):
        return "'parameters' must be an object", 0
    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in tensor:
            return "has neither 'data' nor 'binary_data_size'", 0
        count = _count(tensor["data"])
        if count != math.prod(shape):
            return f"'data' holds {count} elements but shape {shape} needs {math.prod(shape)}", 0
        return None, 0
    if type(size) is not int or size < 0:
        return f"binary_data_size must be a non-negative integer, got {size!r}", 0
    if not has_binary and size:
        return f"binary_data_size {size} but no {header_field}", 0
    return None, size


def _count(data) -> int:
    """Elements of a (nested) JSON data list; a scalar counts as one."""
    if not isinstance(data, list):
        return 1
    total, stack = 0, [data]
    while stack:
        for item in stack.pop():
            if isinstance(item, list):
                stack.append(item)
            else:
                total += 1
    return total
