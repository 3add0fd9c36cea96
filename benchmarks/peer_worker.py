"""Runs sentence-transformers in its own process and environment for the bench: `python peer_worker.py`.

Reads one JSON request per line on stdin and answers one JSON line on stdout (libraries' own prints go to
stderr). It imports only the standard library, numpy and sentence-transformers, so it runs in a peer's venv
(dist/bench/peers/<name>/) as well as in .venv.

    {"op": "load", "model": <folder>, "backend": "torch" | "openvino" | "onnx", "export_dir": <folder> | null}
        → {"versions": {...}, "load_s": float, "loaded_from": <folder>}
    {"op": "encode", "sentences": [...], "batch_size": 64, "torch_threads": null, "embeddings": false}
        → {"seconds": float} (+ "embeddings": base64 float32, "shape": [n, dim])

`python peer_worker.py --versions` prints the versions of the packages the report records, as JSON.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = ("sentence-transformers", "infinity-emb", "torch", "transformers", "tokenizers", "openvino", "optimum",
            "optimum-intel", "optimum-onnx", "onnxruntime", "onnxruntime-openvino", "numpy")


def versions(names=PACKAGES) -> dict:
    """The installed version of each of `names` that is installed."""
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def load(request: dict):
    """The model, and the folder it was loaded from: an exported copy when one was saved before (exporting to
    OpenVINO or ONNX takes tens of seconds), else the original, then saved to `export_dir`."""
    from sentence_transformers import SentenceTransformer

    backend, export_dir = request["backend"], request.get("export_dir")
    source = Path(export_dir) if export_dir and (Path(export_dir) / "modules.json").is_file() else request["model"]
    model = SentenceTransformer(str(source), backend=backend, device="cpu")
    if export_dir and source != Path(export_dir):
        model.save_pretrained(export_dir)
    return model, str(source)


@contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads for one call (None: torch's default, one per core)."""
    if not threads:
        yield
        return
    import torch

    default = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(default)


def main() -> int:
    if sys.argv[1:] == ["--versions"]:
        print(json.dumps(versions()))
        return 0
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # native libraries' writes to fd 1 must not interleave either
    sys.stdout = sys.stderr  # library prints must not interleave with the answers
    model = None
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "load":
                start = time.perf_counter()
                model, loaded_from = load(request)
                answer = {"versions": versions(), "load_s": time.perf_counter() - start, "loaded_from": loaded_from}
            elif request["op"] == "encode":
                with torch_threads(request.get("torch_threads")):
                    start = time.perf_counter()
                    vectors = model.encode(request["sentences"], batch_size=request["batch_size"],
                                           convert_to_numpy=True)
                    answer = {"seconds": time.perf_counter() - start}
                if request.get("embeddings"):
                    answer["embeddings"] = base64.b64encode(vectors.astype("float32").tobytes()).decode()
                    answer["shape"] = list(vectors.shape)
            else:
                answer = {"error": f"unknown op {request['op']!r}"}
        except Exception as e:  # noqa: BLE001 - the bench reports it and goes on with the other sides
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
