"""Talk to a served ensemble with tritonclient (binary tensors over HTTP)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def text_input(texts: Sequence[str | bytes]):
    import tritonclient.http as http

    values = np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=object)
    tensor = http.InferInput("TEXT", list(values.shape), "BYTES")
    tensor.set_data_from_numpy(values, binary_data=True)
    return tensor


def embed(url: str, model: str, texts: Sequence[str | bytes], client=None) -> np.ndarray:
    """EMBEDDING rows for `texts`, sent as one request."""
    import tritonclient.http as http

    own = client is None
    client = client or http.InferenceServerClient(url)
    try:
        output = http.InferRequestedOutput("EMBEDDING", binary_data=True)
        return client.infer(model, [text_input(texts)], outputs=[output]).as_numpy("EMBEDDING")
    finally:
        if own:
            client.close()
