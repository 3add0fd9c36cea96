"""Packing: several sentences run as one sequence, without padding (the text encoder's `packed` export).

The packed encoder takes `input_ids`, `position_ids` (restarting at 0 for each sentence), `segment_ids` (which
sentence a token belongs to; attention stays inside a sentence) and optionally `token_type_ids`, all shaped
[1, tokens], and returns [1, tokens, hidden] — or, exported with pooling, [sentences, hidden]. Numpy only: copied
beside the runner's model.py.
"""

from __future__ import annotations

import numpy as np

PACKED_FEATURES = ("input_ids", "token_type_ids")  # per-token inputs that are concatenated as they are


def pack_groups(lengths: list[int], max_tokens: int, max_rows: int = 0, spread: int = 1) -> list[list[int]]:
    """Indices of rows, in order, grouped so each group's total length stays ≤ max_tokens (a longer row runs alone)
    and, with `max_rows`, each group has at most that many rows.

    Attention inside a pack spans all its tokens (masked across sentences), so its cost grows with the square of
    the pack's length: the budget keeps that small next to the linear layers, which packing makes efficient.
    `spread` > 1 asks for packs of about 1/spread of all tokens each, so that that many infer requests running at
    once get similar work (a batch that would fill one pack is split rather than run on one core)."""
    share = sum(lengths) / spread if spread > 1 else float("inf")
    groups: list[list[int]] = []
    total = 0
    for i, n in enumerate(lengths):
        if (groups and total + n <= max_tokens and (not max_rows or len(groups[-1]) < max_rows)
                and total + n / 2 <= share):
            groups[-1].append(i)
            total += n
        else:
            groups.append([i])
            total = n
    return groups


def packed_inputs(rows: list[dict[str, np.ndarray]], multiple: int = 1) -> dict[str, np.ndarray]:
    """Rows (each a dict of 1-D token arrays, real tokens only) → the packed encoder's inputs, the sequence padded
    to a multiple of `multiple` tokens with a segment of its own (which no row reads back).

    Why pad at all: OpenVINO keeps compiled state and buffers per input shape; with every pack length from 1 to
    256 a serving process grew by ~450 MB over 10,000 requests. Multiples of 16 bound that to 16 shapes at no
    measured cost (the reused shapes pay for the padding)."""
    lengths = [len(row["input_ids"]) for row in rows]
    pad = -sum(lengths) % multiple
    padding = {name: np.zeros(pad, dtype=rows[0][name].dtype) for name in PACKED_FEATURES if name in rows[0]}
    feeds = {name: np.concatenate([row[name] for row in rows] + [padding[name]])[None] for name in padding}
    feeds["position_ids"] = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths + [pad]])[None]
    feeds["segment_ids"] = np.repeat(np.arange(len(rows) + 1, dtype=np.int64), lengths + [pad])[None]
    return feeds


def unpacked(output: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """[1, tokens, ...] → one [length, ...] array per row (any padding after the last row dropped)."""
    return np.split(output[0], np.cumsum(lengths))[:len(lengths)]
