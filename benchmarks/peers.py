"""Peers that cannot share .venv's pins, each in its own venv under dist/bench/peers/<name>/, made on first use.

- `st-openvino`: sentence-transformers 6.2.0 with its OpenVINO backend (optimum-intel wants transformers 5.5).
- `infinity`: infinity-emb, a served embedding peer (it wants sentence-transformers 3.4 and transformers 4.57); its
  venv also runs sentence-transformers' ONNX backend, because `sentence-transformers[onnx]==6.2.0` does not install
  (optimum-onnx needs transformers < 4.58, sentence-transformers 6.2 needs ≥ 5).
- `infinity-openvino`: the same with onnxruntime-openvino in place of onnxruntime. infinity-emb's optimum engine
  runs ONNX Runtime's OpenVINO execution provider on the CPU wherever it is installed (f32 on the CPU, as the default
  CPU provider), which made it 1.14–1.20× faster at c=8 than the default provider on an AMX Xeon.

Each gets the CPU build of torch 2.13.0 that lies on this machine's disk, and no torchvision: the registry's
torchvision fails to register its ops with that build, which breaks `transformers` at import.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.meters import CPU
from benchmarks.sides import WORKER
from tritonpack.children import start_child
from tritonpack.server import free_port

TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class PeerEnv:
    name: str
    requirements: tuple[str, ...]
    swaps: tuple[tuple[str, str], ...] = ()  # (a package the requirements installed, the one installed instead)

    def folder(self, root: Path) -> Path:
        return root / self.name

    def python(self, root: Path) -> Path:
        return self.folder(root) / "bin" / "python"

    @property
    def stamp(self) -> str:
        return "\n".join((TORCH, *self.requirements, *(f"{old} -> {new}" for old, new in self.swaps))) + "\n"

    def ready(self, root: Path) -> bool:
        marker = self.folder(root) / ".installed"
        return marker.is_file() and marker.read_text() == self.stamp

    def create(self, root: Path, log: Path) -> None:
        """A fresh venv with the requirements (minutes: the packages come from the registry)."""
        folder = self.folder(root)
        shutil.rmtree(folder, ignore_errors=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            def step(*command: str) -> None:
                subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=1800)

            step(sys.executable, "-m", "venv", str(folder))
            pip = str(folder / "bin" / "pip")
            step(pip, "install", "--quiet", TORCH, *self.requirements)
            step(pip, "uninstall", "--yes", "--quiet", "torchvision")
            for old, new in self.swaps:  # both install the same module: the old one goes first
                step(pip, "uninstall", "--yes", "--quiet", old)
                step(pip, "install", "--quiet", new)
        (folder / ".installed").write_text(self.stamp)

    def versions(self, root: Path) -> dict:
        result = subprocess.run([str(self.python(root)), str(WORKER), "--versions"], capture_output=True, text=True,
                                check=True, timeout=120)
        return json.loads(result.stdout)


ST_OPENVINO = PeerEnv("st-openvino", ("sentence-transformers[openvino]==6.2.0",))
INFINITY = PeerEnv("infinity", ("infinity-emb[server,torch,optimum]==0.0.78",))
INFINITY_OPENVINO = PeerEnv("infinity-openvino", INFINITY.requirements,
                            swaps=(("onnxruntime", "onnxruntime-openvino==1.24.1"),))


@dataclass(frozen=True)
class InfinityEngine:
    """One way to run infinity-emb: its `--engine` from a peer venv, at its `--dtype` where one is given."""
    name: str
    engine: str
    env: PeerEnv
    dtype: str = ""  # infinity-emb's `--dtype`; empty: its default (float32 on the CPU)

    @property
    def reads_onnx(self) -> bool:
        return self.engine == "optimum"


INFINITY_ENGINES = {engine.name: engine for engine in (
    InfinityEngine("optimum", "optimum", INFINITY),
    InfinityEngine("optimum-openvino", "optimum", INFINITY_OPENVINO),
    InfinityEngine("torch", "torch", INFINITY),
    # torch's matrix products in bf16: faster where the CPU has native bf16, compared only if it holds the floor
    InfinityEngine("torch-bf16", "torch", INFINITY, "bfloat16"),
)}


def onnx_model_folder(root: Path, model: Path, log: Path) -> Path:
    """MiniLM's folder (linked) plus `model.onnx` exported by optimum (plain transformers outputs, fp32), which
    infinity-emb's optimum engine needs. The hub's copy of the model also ships int8 ONNX files that infinity
    prefers on CPU; they are left out here: the bench compares embeddings within cosine 0.9999."""
    folder = INFINITY.folder(root) / "model-onnx"
    if (folder / "model.onnx").is_file():
        return folder
    staging = Path(tempfile.mkdtemp(prefix="export-", dir=INFINITY.folder(root)))
    with open(log, "ab") as out:
        subprocess.run([str(INFINITY.folder(root) / "bin" / "optimum-cli"), "export", "onnx", "--model", str(model),
                        "--task", "feature-extraction", "--library-name", "transformers", str(staging)],
                       stdout=out, stderr=subprocess.STDOUT, check=True, timeout=900, env=_offline())
    folder.mkdir()
    for item in model.iterdir():
        (folder / item.name).symlink_to(item)
    (staging / "model.onnx").rename(folder / "model.onnx")
    shutil.rmtree(staging)
    return folder


def _offline() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}


class InfinityServer:
    """`infinity_emb v2` on 127.0.0.1 with one engine, started from its peer venv in its own process group.

    The optimum engine runs from inside the model folder with `--model-id .`: infinity-emb 0.0.78 hands the ONNX
    path it found to optimum, which matches it only as a name relative to the folder.
    """

    MODEL_NAME = "minilm"

    def __init__(self, root: Path, engine: InfinityEngine, model_folder: Path, log: Path, batch_size: int = 64):
        self.engine, self.log = engine.name, log
        self.port = free_port()
        local = engine.reads_onnx
        venv = engine.env.folder(root)
        self.command = [str(venv / "bin" / "infinity_emb"), "v2",
                        "--model-id", "." if local else str(model_folder), "--engine", engine.engine, "--device", "cpu",
                        "--host", "127.0.0.1", "--port", str(self.port), "--batch-size", str(batch_size),
                        "--served-model-name", self.MODEL_NAME, "--pooling-method", "mean", "--log-level", "warning",
                        *(("--dtype", engine.dtype) if engine.dtype else ())]
        self.cwd = model_folder if local else venv
        self.env = {**_offline(), "HF_HOME": str(venv / "hf")}
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 300) -> InfinityServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = start_child(self.command, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                       start_new_session=True)
        CPU.watch(self.process.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"infinity-emb ({self.engine}) exited at start-up; log: {self.log}")
            if self._healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"infinity-emb ({self.engine}) not healthy after {timeout_s:.0f}s; log: {self.log}")

    def _healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        if self.process is None:
            return
        CPU.forget(self.process.pid)
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None


class OpenAIEmbeddingsClient:
    """POST /embeddings (OpenAI's API, which infinity-emb serves) over one keep-alive connection, opened again when
    the server has closed it (uvicorn closes connections idle for 5 s), as pooled HTTP clients do."""

    STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)

    def __init__(self, port: int, model: str):
        self.model = model
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def _post(self, body: str) -> tuple[int, bytes]:
        self.connection.request("POST", "/embeddings", body, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        return response.status, response.read()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        body = json.dumps({"model": self.model, "input": list(texts)})
        try:
            status, payload = self._post(body)
        except self.STALE:
            self.connection.close()
            status, payload = self._post(body)
        if status != 200:
            raise RuntimeError(f"infinity-emb answered {status}: {payload[:200]!r}")
        return np.array([row["embedding"] for row in json.loads(payload)["data"]], dtype=np.float32)

    def close(self) -> None:
        self.connection.close()
