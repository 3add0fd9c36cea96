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


def infer_one(url: str, model: str, tensor, output: str, client=None, **output_options) -> np.ndarray:
    """One request with one input tensor; the named output as numpy (a client is opened if none is given)."""
    import tritonclient.http as http

    own = client is None
    client = client or http.InferenceServerClient(url)
    try:
        requested = http.InferRequestedOutput(output, binary_data=True, **output_options)
        return client.infer(model, [tensor], outputs=[requested]).as_numpy(output)
    finally:
        if own:
            client.close()


def embed(url: str, model: str, texts: Sequence[str | bytes], client=None) -> np.ndarray:
    """EMBEDDING rows for `texts`, sent as one request."""
    return infer_one(url, model, text_input(texts), "EMBEDDING", client)


def image_input(images: Sequence[bytes], name: str = "IMAGE"):
    """Encoded images as one UINT8 [n, longest] tensor, zero-padded (decoders stop at the image's end marker)."""
    import tritonclient.http as http

    if not images:
        raise ValueError("no images to send")
    longest = max(len(image) for image in images)
    values = np.zeros((len(images), longest), dtype=np.uint8)
    for row, image in zip(values, images):
        row[:len(image)] = np.frombuffer(image, dtype=np.uint8)
    tensor = http.InferInput(name, list(values.shape), "UINT8")
    tensor.set_data_from_numpy(values, binary_data=True)
    return tensor


def scores(url: str, model: str, images: Sequence[bytes], client=None) -> np.ndarray:
    """SCORES rows (FP32 [n, classes]) for `images`, sent as one request."""
    return infer_one(url, model, image_input(images), "SCORES", client)


def classify(url: str, model: str, images: list[bytes], class_count: int = 5, client=None) -> list[list[str]]:
    """Top `class_count` classes per image through Triton's classification extension, best first.

    Each entry is Triton's "score:index:label" string (the label comes from the model's `label_filename`).
    """
    result = infer_one(url, model, image_input(images), "SCORES", client, class_count=class_count)
    return [[v.decode() if isinstance(v, bytes) else str(v) for v in row] for row in result.reshape(len(images), -1)]


def sample_image(name: str = "chelsea.png") -> bytes:
    """A real photograph shipped with scikit-image (default: Chelsea the tabby cat, PNG 451x300)."""
    from importlib.resources import files

    return files("skimage.data").joinpath(name).read_bytes()
