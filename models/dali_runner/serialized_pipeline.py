"""Run a serialized DALI pipeline (`model.dali`) on the CPU, as Triton's DALI backend would with KIND_CPU.

Imports numpy and DALI only. The pipeline runs on DALI's dynamic executor, which stays usable after an operator
fails (an undecodable image): the classic executors leave the pipeline invalid, and rebuilding it after every failure
left 57-170 MB more in a served stub after 150 undecodable requests (docs/performance.md, thirty-third round).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np


class PipelineRunFailed(RuntimeError):
    """DALI could not process the batch; for an image pipeline, almost always an undecodable sample."""


class SerializedPipeline:
    def __init__(self, serialized: bytes, input_name: str, max_batch_size: int, num_threads: int = 1):
        from nvidia.dali import Pipeline

        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.input_name = input_name
        self.max_batch_size = max_batch_size
        # Without prefetching: one feed_input, one run, one output batch.
        self._pipe = Pipeline.deserialize(serialized_pipeline=serialized, batch_size=max_batch_size,
                                          num_threads=max(1, num_threads), device_id=None, prefetch_queue_depth=1,
                                          exec_dynamic=True)
        self._pipe.build()

    @classmethod
    def from_file(cls, path: str, **kwargs) -> SerializedPipeline:
        with open(path, "rb") as f:
            return cls(f.read(), **kwargs)

    def run(self, samples: Sequence[np.ndarray], weights: Sequence[int] = (), max_weight: int = 0) -> list[np.ndarray]:
        """The pipeline's first output for each sample (1-D uint8 arrays), in order: in runs of at most
        `max_batch_size` samples whose `weights` (pixels) add up to at most `max_weight` (0: no limit; a sample
        heavier than that runs alone)."""
        outputs: list[np.ndarray] = []
        for run in _runs(len(samples), self.max_batch_size, weights, max_weight):
            outputs.extend(self._run_chunk([samples[i] for i in run]))
        return outputs

    def _run_chunk(self, samples: Sequence[np.ndarray]) -> list[np.ndarray]:
        try:
            self._pipe.feed_input(self.input_name, [np.ascontiguousarray(s, dtype=np.uint8) for s in samples])
            result = self._pipe.run()[0]
        except Exception as e:  # noqa: BLE001 - DALI raises RuntimeError subclasses with multi-line text
            raise PipelineRunFailed(_reason(e)) from None
        return [np.array(result[i]) for i in range(len(samples))]


def _runs(count: int, max_batch_size: int, weights: Sequence[int], max_weight: int) -> list[range]:
    runs, start, total = [], 0, 0
    for i in range(count):
        weight = weights[i] if weights else 0
        if i > start and (i - start == max_batch_size or (max_weight and total + weight > max_weight)):
            runs.append(range(start, i))
            start, total = i, 0
        total += weight
    return runs + ([range(start, count)] if count else [])


def _reason(error: Exception) -> str:
    """What failed, in one line: DALI's text names the operator and carries the pipeline's source traceback (paths
    of the build machine), then what it encountered; its decoder's own reason goes to the log only."""
    text = str(error)
    operator = re.search(r"Error in \w+ operator `([^`]+)`", text)
    if operator and "decoders" in operator[1]:
        return ("not an image DALI decodes (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000), or truncated or damaged; "
                "the server log has the decoder's reason")
    encountered = text.split("encountered:", 1)[-1].strip().splitlines()
    return f"preprocessing failed: {encountered[0]}" if encountered else type(error).__name__


def rows_to_samples(array: np.ndarray) -> list[np.ndarray]:
    """An IMAGE input of shape [n, bytes] (zero-padded to the longest) → n 1-D samples.

    JPEG and PNG decoders stop at their end marker, so trailing padding is harmless and kept.
    """
    if array.ndim != 2:
        raise ValueError(f"expected IMAGE of shape [batch, bytes], got {list(array.shape)}")
    if array.dtype != np.uint8:
        raise ValueError(f"expected IMAGE as UINT8, got {array.dtype}")
    samples = [array[i] for i in range(array.shape[0])]
    for i, sample in enumerate(samples):
        if sample.size == 0 or not sample.any():
            raise ValueError(f"IMAGE[{i}] is empty")
    return samples
