"""Sentence embedding from token embeddings, as sentence-transformers' Pooling(mean) [+ Normalize]."""

from __future__ import annotations

import numpy as np


def mean_pool(token_embeddings: np.ndarray, attention_mask: np.ndarray, normalize: bool) -> np.ndarray:
    mask = attention_mask.astype(token_embeddings.dtype)[..., None]
    summed = (token_embeddings * mask).sum(axis=1)
    counts = np.clip(mask.sum(axis=1), 1e-9, None)
    pooled = summed / counts
    if normalize:
        pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return pooled.astype(np.float32, copy=False)
