"""Image-classification recipes: DALI preprocessing (decode, resize, normalise) → classifier, `IMAGE` → `SCORES`.

A recipe only describes: which `pipelines/` preprocessing it uses, which classifier model in which artifact format
runs on each target, its label file, and how each target serves (`ImageServing`). `tritonpack.assembly.image`
renders it; `build/` produces the artifacts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from tritonpack.backends import FRAMEWORKS
from tritonpack.errors import SpecError
from tritonpack.spec import DynamicBatching, Tensor, override_fields

LABELS_DIR = Path(__file__).resolve().parent / "labels"
IMAGENET_1000 = LABELS_DIR / "imagenet1000.txt"
IMAGENET_1001 = LABELS_DIR / "imagenet1001_background.txt"  # TF-slim layout: class 0 is "background"
MAX_IMAGE_PIXELS = 50_000_000  # ~7000×7000; models/dali_runner/model.py has the same default
CLASSIFIER_MODELS = ("resnet50", "inception_v3")  # what build/ can produce


@dataclass(frozen=True)
class ImageServing:
    """Batching, threads and limits for one target (see README, "Image ensembles")."""

    max_batch_size: int = 128  # the seeds' value; the TensorRT profile and warmup use it too
    max_queue_delay_microseconds: int = 5000
    dali_threads: int = 2
    classifier_instances: int = 1
    # Decompression-bomb guard: the portable DALI runner refuses (400) an image whose JPEG/PNG header claims more
    # pixels, before decoding. Rendered into its `parameters`; 0 disables it. Triton's native DALI backend
    # (cpu/gpu targets) has no such check.
    max_image_pixels: int = MAX_IMAGE_PIXELS

    def __post_init__(self) -> None:
        for setting in ("max_batch_size", "dali_threads", "classifier_instances"):
            if getattr(self, setting) < 1:
                raise SpecError(f"ImageServing: {setting} must be at least 1, got {getattr(self, setting)}")
        if self.max_image_pixels < 0:
            raise SpecError(f"ImageServing: max_image_pixels must be >= 0 (0: no limit), got {self.max_image_pixels}")

    def with_overrides(self, overrides) -> ImageServing:
        """`(("max_image_pixels", "1000000"),)` (strings, as from the command line's `--serving KEY=VALUE`)."""
        return override_fields(self, overrides)

    @property
    def dynamic_batching(self) -> DynamicBatching:
        return DynamicBatching(max_queue_delay_microseconds=self.max_queue_delay_microseconds)


IMAGE_SERVING = MappingProxyType({
    "portable": ImageServing(),  # 2 CPU cores in CI: one instance per step, DALI on both cores
    "cpu": ImageServing(),
    "gpu": ImageServing(dali_threads=4),
})


@dataclass(frozen=True)
class Classifier:
    """The classifier step: which model `build/` produces (`model`), its artifact's tensors, and the artifact
    format per target (`formats`); `alternatives` are formats a build may pick instead (`--model-format`)."""

    model: str
    input: Tensor
    output: Tensor
    formats: Mapping[str, str]
    alternatives: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "formats", MappingProxyType(dict(self.formats)))
        if self.model not in CLASSIFIER_MODELS:
            raise SpecError(f"classifier model {self.model!r} is not one of {', '.join(CLASSIFIER_MODELS)}")
        unknown = sorted((set(self.formats.values()) | set(self.alternatives)) - set(FRAMEWORKS))
        if unknown:
            raise SpecError(f"classifier {self.model}: unknown formats {unknown}")


@dataclass(frozen=True)
class ImageRecipe:
    """`preprocessing`: a `pipelines.classification.RECIPES` key; the recipe's targets are those its classifier
    has a format for; `serving`: target → settings."""

    name: str
    preprocessing: str
    classifier: Classifier
    labels: Path
    serving: Mapping[str, ImageServing] = field(default_factory=lambda: IMAGE_SERVING)

    def __post_init__(self) -> None:
        object.__setattr__(self, "serving", MappingProxyType(dict(self.serving)))
        missing = sorted(set(self.classifier.formats) - set(self.serving))
        if missing:
            raise SpecError(f"recipe {self.name}: no serving settings for targets {missing}")

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.classifier.formats)
