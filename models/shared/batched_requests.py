"""Request handling shared by every python model: batch across requests, keep each request's errors its own.

Copied beside each python model's `model.py` at build time; imports numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


class ClientError(ValueError):
    """A mistake in one request (answered with INVALID_ARG); never fails the other requests of a batch."""


def read_input(pb_utils, request, name: str) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ClientError(f"input {name} is missing")
    return tensor.as_numpy()


def pad_and_concat(arrays: Sequence[np.ndarray], pad_value=0) -> np.ndarray:
    """Concatenate along the batch axis, padding axis 1 (the sequence) to the longest."""
    if len(arrays) == 1:
        return arrays[0]
    if arrays[0].ndim < 2:
        return np.concatenate(arrays)
    longest = max(a.shape[1] for a in arrays)
    padded = [
        a if a.shape[1] == longest
        else np.pad(a, [(0, 0), (0, longest - a.shape[1])] + [(0, 0)] * (a.ndim - 2), constant_values=pad_value)
        for a in arrays
    ]
    return np.concatenate(padded)


def split_rows(array: np.ndarray, sizes: Sequence[int], lengths: Sequence[int] | None = None) -> list[np.ndarray]:
    """Undo `pad_and_concat`: rows per request, trimmed back to each request's sequence length if given."""
    parts, start = [], 0
    for i, size in enumerate(sizes):
        part = array[start:start + size]
        if lengths is not None:
            part = part[:, :lengths[i]]
        parts.append(part)
        start += size
    return parts


def respond_all(pb_utils, requests, parse: Callable, compute: Callable, to_tensors: Callable, logger=None) -> list:
    """One response per request.

    parse(request) -> item, raising ClientError for a bad request;
    compute(items) -> one result per item, in a single vectorised call;
    to_tensors(result) -> the response's output tensors.
    If the vectorised call fails, each item is retried alone so only the culprit gets the error.
    """
    responses: list = [None] * len(requests)
    items, positions = [], []
    for i, request in enumerate(requests):
        try:
            items.append(parse(request))
            positions.append(i)
        except ClientError as e:
            responses[i] = error_response(pb_utils, str(e), pb_utils.TritonError.INVALID_ARG)
    results: list = []
    if items:
        try:
            results = compute(items)
        except Exception as e:  # noqa: BLE001 - isolate the failing item below
            if len(items) == 1:
                results = [e]
            else:
                results = []
                for item in items:
                    try:
                        results.extend(compute([item]))
                    except Exception as single:  # noqa: BLE001
                        results.append(single)
    for i, result in zip(positions, results, strict=True):
        responses[i] = _response(pb_utils, result, to_tensors, logger)
    return responses


def _response(pb_utils, result, to_tensors: Callable, logger):
    """One request's response: its tensors, or its error (an answer that cannot be built fails this request only)."""
    if isinstance(result, ClientError):
        return error_response(pb_utils, str(result), pb_utils.TritonError.INVALID_ARG)
    if not isinstance(result, Exception):
        try:
            return pb_utils.InferenceResponse(output_tensors=to_tensors(result))
        except Exception as e:  # noqa: BLE001
            result = e
    if logger is not None:
        logger.log_error(f"inference failed: {type(result).__name__}: {result}")
    return internal_error(pb_utils, result)


def internal_error(pb_utils, error: Exception):
    """An INTERNAL error response naming only the exception's type: its text (a TorchScript error carries the build
    machine's source paths and a traceback) is for the server log, not for the client."""
    return error_response(pb_utils, f"internal error ({type(error).__name__}); the server log has the details",
                          pb_utils.TritonError.INTERNAL)


def error_response(pb_utils, message: str, code):
    """A response carrying only an error (`pb_utils.TritonError` code: INVALID_ARG for a client's mistake)."""
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
