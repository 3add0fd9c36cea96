"""Talk to a served ensemble with tritonclient (binary tensors over HTTP); tensors follow `tritonpack.contracts`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tritonpack import contracts
from tritonpack.codec import infer_inputs, requested_outputs
from tritonpack.errors import TritonpackError, UserError


def infer(url: str, model: str, arrays: Mapping[str, np.ndarray], output: str, client=None,
          class_count: int = 0) -> np.ndarray:
    """One request with the named input arrays; the named output as numpy (a client is opened if none is given)."""
    import tritonclient.http as http

    own = client is None
    client = client or http.InferenceServerClient(url)
    try:
        result = client.infer(model, infer_inputs(arrays), outputs=requested_outputs([output], class_count=class_count))
        return result.as_numpy(output)
    finally:
        if own:
            client.close()


def text_inputs(texts: Sequence[str | bytes], io: contracts.IoNames = contracts.TEXT) -> list:
    """tritonclient inputs for one request of `texts` (for callers that drive a client themselves)."""
    return infer_inputs({io.input: contracts.text_array(texts)})


def image_inputs(images: Sequence[bytes], io: contracts.IoNames = contracts.IMAGE) -> list:
    return infer_inputs({io.input: contracts.image_array(images)})


def embed(url: str, model: str, texts: Sequence[str | bytes], client=None,
          io: contracts.IoNames = contracts.TEXT) -> np.ndarray:
    """Embedding rows for `texts`, sent as one request."""
    return infer(url, model, {io.input: contracts.text_array(texts)}, io.output, client)


def served_embeddings(url: str, model: str, texts: Sequence[str | bytes]) -> np.ndarray:
    """`embed` for the command line, with the model's own tensor names (an ensemble built with `--io-names`), in
    requests of at most its max_batch_size texts; a server that cannot be reached, or that answers an error, is one
    line."""
    from http.client import HTTPException

    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    address = http_address(url)
    quiet_interrupts()
    try:
        client = http.InferenceServerClient(address)
        try:
            io, batch = text_contract(client, model, address)
            return np.concatenate([embed(address, model, texts[start:start + batch], client, io)
                                   for start in range(0, len(texts), batch)])
        finally:
            client.close()
    except TimeoutError:  # an OSError too, but something listens there: it did not answer in time
        raise TritonpackError(f"{address} did not answer within 60 s (tritonclient's timeout): a server still "
                              f"loading, or not Triton's HTTP port") from None
    except OSError as e:
        raise UserError(f"nothing answers at {address} ({e.strerror or e}): start a server first, e.g. "
                        f"`tritonpack serve dist/bert-portable --http-port 8000`, or pass its --url") from None
    except InferenceServerException as e:
        raise TritonpackError(f"{model} at {address}: {e.message()}") from None
    except (HTTPException, ValueError):  # not HTTP (geventhttpclient's HTTPParseError), or not JSON (rapidjson's)
        raise UserError(f"{address} did not answer as Triton's HTTP endpoint (is it the gRPC port, 8001?): pass "
                        f"the HTTP port as --url, e.g. 127.0.0.1:8000") from None


def text_contract(client, model: str, address: str) -> tuple[contracts.IoNames, int]:
    """The served model's text input and embedding output, and how many texts one request may hold; a model that is
    not served, or does not take text, is one line saying what is served or what it takes."""
    from tritonclient.utils import InferenceServerException

    try:
        metadata = client.get_model_metadata(model)
    except InferenceServerException as e:
        if "unknown model" not in (e.message() or ""):
            raise
        served = sorted({m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"})
        raise UserError(f"{model!r} is not served at {address} (served: {', '.join(served) or 'none'}): pass "
                        f"--model NAME") from None
    texts = [t["name"] for t in metadata["inputs"] if t["datatype"] == "BYTES"]
    vectors = [t["name"] for t in metadata["outputs"] if t["datatype"] == "FP32"]
    if len(metadata["inputs"]) != 1 or not texts or not vectors:
        takes, answers = (", ".join(f"{t['name']} ({t['datatype']})" for t in metadata[side])
                          for side in ("inputs", "outputs"))
        raise UserError(f"{model!r} at {address} takes {takes} and answers {answers}: `infer` sends one text input "
                        f"and reads an FP32 embedding, as an embedding ensemble does (e.g. `make ensemble NAME=bert`)")
    output = contracts.TEXT.output if contracts.TEXT.output in vectors else vectors[0]
    max_batch_size = client.get_model_config(model).get("max_batch_size", 0)
    return contracts.IoNames(texts[0], output), max_batch_size or 2**31  # 0: no batching, one request


def quiet_interrupts() -> None:
    """Ctrl-C while tritonclient waits reaches gevent's hub, which printed it before handing it on to the caller."""
    import gevent

    hub = gevent.get_hub()
    if not issubclass(KeyboardInterrupt, hub.NOT_ERROR):
        hub.NOT_ERROR = (*hub.NOT_ERROR, KeyboardInterrupt)


def http_address(url: str) -> str:
    """host:port of `--url` (host:port or http://host:port), refused in one line when it is not that."""
    scheme, _, address = url.rpartition("://")
    host, _, port = address.rpartition(":")
    if scheme not in ("", "http") or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--url {url}: Triton's HTTP endpoint as host:port (or http://host:port) with a port of "
                        f"1-65535, e.g. 127.0.0.1:8000")
    return address


def scores(url: str, model: str, images: Sequence[bytes], client=None,
           io: contracts.IoNames = contracts.IMAGE) -> np.ndarray:
    """Score rows (FP32 [n, classes]) for encoded `images`, sent as one request."""
    return infer(url, model, {io.input: contracts.image_array(images)}, io.output, client)


def classify(url: str, model: str, images: list[bytes], class_count: int = 5, client=None,
             io: contracts.IoNames = contracts.IMAGE) -> list[list[str]]:
    """Top `class_count` classes per image through Triton's classification extension, best first.

    Each entry is Triton's "score:index:label" string (the label comes from the model's `label_filename`).
    """
    result = infer(url, model, {io.input: contracts.image_array(images)}, io.output, client, class_count=class_count)
    return [[v.decode() if isinstance(v, bytes) else str(v) for v in row] for row in result.reshape(len(images), -1)]


def sample_image(name: str = "chelsea.png") -> bytes:
    """A real photograph shipped with scikit-image (default: Chelsea the tabby cat, PNG 451x300)."""
    from importlib.resources import files

    return files("skimage.data").joinpath(name).read_bytes()
