"""Sentence embedding from token embeddings, as sentence-transformers' Pooling(mean) [+ Normalize]."""

from __future__ import annotations

import numpy as np


def mean_pool(token_embeddings: np.ndarray, attention_mask: np.ndarray, normalize: bool) -> np.ndarray:
    """[rows, tokens, hidden] and [rows, tokens] → [rows, hidden]. Each row's masked sum in one pass of einsum's own
    loop, without a masked copy of the tokens; not np.matmul, whose BLAS threads took the encoder's cores in a
    served ensemble (docs/performance.md, fortieth round)."""
    weights = attention_mask.astype(token_embeddings.dtype)
    summed = np.einsum("rt,rth->rh", weights, token_embeddings)
    pooled = summed / np.clip(weights.sum(axis=1, keepdims=True), 1e-9, None)
    if normalize:
        pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return pooled.astype(np.float32, copy=False)
