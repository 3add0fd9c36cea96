"""Mean pooling against a plain-loop numpy reference, with masks."""

from __future__ import annotations

import numpy as np

from tritonpack.components import load_model_module

mean_pool = load_model_module("mean_pooling", "pooling").mean_pool


def reference_mean_pool(embeddings, mask, normalize):
    rows = []
    for tokens, row_mask in zip(embeddings, mask, strict=True):
        kept = [t for t, m in zip(tokens, row_mask, strict=True) if m]
        vector = np.mean(kept, axis=0) if kept else np.zeros(tokens.shape[-1])
        if normalize:
            vector = vector / max(np.linalg.norm(vector), 1e-12)
        rows.append(vector)
    return np.array(rows)


def test_mean_pool_matches_loop_reference_when_masks_vary():
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(5, 7, 16)).astype(np.float32)
    mask = np.array([[1] * 7, [1, 1, 0, 0, 0, 0, 0], [1] * 3 + [0] * 4, [1] + [0] * 6, [1] * 6 + [0]])
    for normalize in (False, True):
        np.testing.assert_allclose(mean_pool(embeddings, mask, normalize),
                                   reference_mean_pool(embeddings, mask, normalize), rtol=1e-5, atol=1e-6)


def test_mean_pool_ignores_padded_positions_when_they_hold_garbage():
    embeddings = np.ones((1, 4, 3), dtype=np.float32)
    embeddings[0, 2:] = 1e6
    pooled = mean_pool(embeddings, np.array([[1, 1, 0, 0]]), normalize=False)
    np.testing.assert_allclose(pooled, [[1, 1, 1]])


def test_mean_pool_returns_unit_vectors_when_normalizing():
    rng = np.random.default_rng(1)
    pooled = mean_pool(rng.normal(size=(4, 5, 8)).astype(np.float32), np.ones((4, 5), dtype=np.int64), True)
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, rtol=1e-6)
    assert pooled.dtype == np.float32


def test_mean_pool_gives_zeros_not_nan_when_mask_is_empty():
    pooled = mean_pool(np.ones((1, 3, 4), dtype=np.float32), np.zeros((1, 3), dtype=np.int64), normalize=True)
    assert np.isfinite(pooled).all() and (pooled == 0).all()
