"""Served `resnet_pt` ÷ the same DALI pipeline and TorchScript in-process; DALI CPU preprocessing ÷ PIL/numpy.

The in-process side is what a user would run without a server: the repository's serialized DALI pipeline and
TorchScript classifier, batch by batch. The PIL/numpy side reproduces the pipeline's recipe (decode, resize the
shorter side to 256 with antialiasing, center-crop 224, ImageNet mean/std, CHW). The served side sends one image
per request from 8 concurrent clients.
"""

from __future__ import annotations

import io
import time

import numpy as np

from benchmarks import goals
from benchmarks.meters import Run, alternate, ratio_summary, side_summary
from benchmarks.sides import ConcurrentClients, TritonHttpClient

BATCH = 8  # in-process batch; the served side sends one image per request at concurrency BATCH
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


def images(n: int, seed: int = 5) -> list[bytes]:
    """`n` deterministic JPEGs of camera-like sizes (smooth gradients plus noise, so they compress like photos)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(640, 480), (480, 640), (800, 600), (512, 512), (1024, 768), (320, 240)]
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * (i + 1)) % 256, (y * 3) % 256, ((x + y) // 2) % 256], axis=-1).astype(np.float32)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


class DaliTorchInProcess:
    """The repository's serialized DALI pipeline and TorchScript classifier, called in-process."""

    def __init__(self, repository, name: str):
        import torch
        from nvidia.dali import Pipeline

        from tritonpack.spec import parse_config

        pre_dir = repository / f"{name}_preprocess"
        cfg = parse_config((pre_dir / "config.pbtxt").read_text())
        threads = int(cfg.parameters["num_threads"].string_value) if "num_threads" in cfg.parameters else 2
        self.pipe = Pipeline.deserialize(serialized_pipeline=(pre_dir / "1" / "model.dali").read_bytes(),
                                         batch_size=BATCH, num_threads=threads, device_id=None,
                                         prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
        self.pipe.build()
        self.model = torch.jit.load(str(repository / f"{name}_classifier" / "1" / "model.pt")).eval()
        self.torch = torch

    def preprocess(self, encoded: list[bytes]) -> np.ndarray:
        from tritonpack.pipelines.classification import INPUT_NAME  # the pipeline's external_source

        self.pipe.feed_input(INPUT_NAME, [np.frombuffer(b, dtype=np.uint8) for b in encoded])
        out = self.pipe.run()[0]
        return np.stack([np.array(out[i]) for i in range(len(encoded))])

    def classify(self, pixels: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            return self.model(self.torch.from_numpy(pixels)).numpy()

    def run(self, batches: list[list[bytes]], classify: bool = True) -> Run:
        start = time.perf_counter()
        for batch in batches:
            pixels = self.preprocess(batch)
            if classify:
                self.classify(pixels)
        return Run(sum(len(b) for b in batches), time.perf_counter() - start)


def pil_preprocess(encoded: bytes) -> np.ndarray:
    """torchvision's eval transform as torchvision computes it on a PIL image: Resize(256) (the longer side
    truncated to int(256 * long / short), PIL bilinear, antialiased), CenterCrop(224) (offsets rounded as Python's
    round), normalise, CHW."""
    from PIL import Image

    image = Image.open(io.BytesIO(encoded)).convert("RGB")
    w, h = image.size
    size = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    image = image.resize(size, Image.BILINEAR)
    left, top = int(round((size[0] - 224) / 2.0)), int(round((size[1] - 224) / 2.0))
    pixels = np.asarray(image.crop((left, top, left + 224, top + 224)), dtype=np.float32)
    return ((pixels - MEAN) / STD).transpose(2, 0, 1)


def run_pil(batches: list[list[bytes]]) -> Run:
    start = time.perf_counter()
    for batch in batches:
        np.stack([pil_preprocess(b) for b in batch])
    return Run(sum(len(b) for b in batches), time.perf_counter() - start)


def measure(bench) -> dict:
    """Builds resnet_pt (portable, random weights), serves it, alternates the sides."""
    from tritonpack.client import scores

    s = bench.settings
    count = 4 if s.mode == "smoke" else 64  # 16 made runs of ~1 s whose ratio swung 0.86-1.04 around its 0.85 goal
    encoded = images(count, s.seed)
    batches = [encoded[i:i + BATCH] for i in range(0, count, BATCH)]
    singles = [[b] for b in encoded]
    built = bench.build_variant("resnet_pt", name="resnet_pt")
    direct = DaliTorchInProcess(built.repository, "resnet_pt")
    direct.run(batches[:1])
    direct_pre = direct.preprocess(encoded[:4])
    pil_pre = np.stack([pil_preprocess(b) for b in encoded[:4]])
    server = bench.serve(built.repository)
    served = ConcurrentClients(lambda: TritonHttpClient(server.url, "resnet_pt", scores))
    try:
        served.send(singles[:BATCH], BATCH)
        bench.log("served resnet_pt (1 image/request, c=8) ÷ DALI + torch in-process (batch 8)")
        runs = alternate({"in-process": lambda: direct.run(batches),
                          "served": lambda: served.send(singles, BATCH)[0]}, s.repetitions, bench.log)
        bench.log("DALI CPU preprocessing ÷ PIL/numpy (batches of 8)")
        pre = alternate({"dali": lambda: direct.run(batches, classify=False), "pil": lambda: run_pil(batches)},
                        s.repetitions, bench.log)
    finally:
        served.close()
        bench.stop_server(server)
    return {
        "images": count, "batch": BATCH, "unit": "images/s",
        "served": side_summary(runs["served"], "images/s"), "in_process": side_summary(runs["in-process"], "images/s"),
        "served_over_in_process": ratio_summary(runs["served"], runs["in-process"],
                                                goals.SERVED_RESNET_OVER_IN_PROCESS),
        "dali": side_summary(pre["dali"], "images/s"), "pil": side_summary(pre["pil"], "images/s"),
        "dali_over_pil": ratio_summary(pre["dali"], pre["pil"]),
        "dali_vs_pil_abs_diff": {"max": float(np.abs(direct_pre - pil_pre).max()),
                                 "mean": float(np.abs(direct_pre - pil_pre).mean())},
        "weights": "random (no pretrained ResNet-50 weights are reachable here); the compute is the same",
    }
