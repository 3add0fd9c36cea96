"""Image-classification ensembles: DALI preprocessing (decode, resize, normalise) → classifier (per target).

Ensemble contract: input `IMAGE` (UINT8 [-1], one encoded JPEG/PNG/BMP per batch row, zero-padded to the
longest) and output `SCORES` (FP32 [classes]) with the class names as `label_filename`, so Triton's
classification extension (`class_count`) answers with labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonpack.components import DaliPipeline, ModelFolder, dali_model
from tritonpack.spec import DynamicBatching, EnsembleStep, ModelSpec, SpecError, Tensor, override_fields

LABELS_DIR = Path(__file__).resolve().parent / "labels"
IMAGENET_1000 = LABELS_DIR / "imagenet1000.txt"
IMAGENET_1001 = LABELS_DIR / "imagenet1001_background.txt"  # TF-slim layout: class 0 is "background"
PIXELS = "PIXELS"  # the preprocessed tensor between the two steps
MAX_IMAGE_PIXELS = 50_000_000  # ~7000×7000; models/dali_runner/model.py has the same default


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
        if self.max_batch_size < 1 or self.dali_threads < 1 or self.classifier_instances < 1:
            raise SpecError(f"ImageServing: batch size, threads and instances must be positive, got {self}")
        if self.max_image_pixels < 0:
            raise SpecError(f"ImageServing: max_image_pixels must be >= 0 (0: no limit), got {self.max_image_pixels}")

    def with_overrides(self, overrides) -> ImageServing:
        """`(("max_image_pixels", "1000000"),)` (strings, as from the command line's `--serving KEY=VALUE`)."""
        return override_fields(self, overrides)

    @property
    def dynamic_batching(self) -> DynamicBatching:
        return DynamicBatching(max_queue_delay_microseconds=self.max_queue_delay_microseconds)


SERVING = {
    "portable": ImageServing(),  # 2 CPU cores in CI: one instance per step, DALI on both cores
    "cpu": ImageServing(),
    "gpu": ImageServing(dali_threads=4),
}


def image_input() -> Tensor:
    return Tensor("IMAGE", "TYPE_UINT8", (-1,))


def dali_pipeline(recipe_name: str, serving: ImageServing, cache: Path) -> DaliPipeline:
    """`model.dali` (CPU) and `dali.py` (GPU, autoserialized) for a recipe, cached by its source and settings."""
    import nvidia.dali

    from tritonpack.build.serialize_dali import AUTOSERIALIZE_ENTRY, PIPELINE_SOURCE, serialize
    from tritonpack.cache import cached_dir

    def produce(out: Path) -> None:
        serialize(recipe_name, out, serving.max_batch_size, serving.dali_threads)

    settings = {"recipe": recipe_name, "max_batch_size": serving.max_batch_size, "threads": serving.dali_threads,
                "dali": nvidia.dali.__version__, "entry": AUTOSERIALIZE_ENTRY}
    out = cached_dir(cache, f"dali-{recipe_name}", PIPELINE_SOURCE, settings, produce)
    return DaliPipeline(serialized=out / "model.dali", source=out / "dali.py")


def image_ensemble(name: str, recipe_name: str, classifier: ModelFolder, labels: Path, target: str,
                   serving: ImageServing, cache: Path) -> list[ModelFolder]:
    """[ensemble, DALI preprocessing, classifier]; the classifier has one input and its scores as first output."""
    from tritonpack.pipelines.classification import RECIPES

    recipe = RECIPES[recipe_name]
    classes = sum(1 for line in labels.read_text().splitlines() if line.strip())
    preprocess = dali_model(
        f"{name}_preprocess", dali_pipeline(recipe_name, serving, cache), target, inputs=(image_input(),),
        outputs=(Tensor(PIXELS, "TYPE_FP32", recipe.output_dims),), max_batch_size=serving.max_batch_size,
        dynamic_batching=serving.dynamic_batching, threads=serving.dali_threads,
        runner_parameters={"max_image_pixels": str(serving.max_image_pixels)},
    )
    scores = Tensor("SCORES", "TYPE_FP32", (classes,))
    ensemble = ModelFolder(ModelSpec(
        name=name, platform="ensemble", max_batch_size=serving.max_batch_size, inputs=(image_input(),),
        outputs=(scores,), labelled_output=scores.name,
        ensemble_steps=(
            EnsembleStep(preprocess.spec.name, {"IMAGE": "IMAGE"}, {PIXELS: PIXELS}),
            EnsembleStep(classifier.spec.name, {classifier.spec.inputs[0].name: PIXELS},
                         {classifier.spec.outputs[0].name: scores.name}),
        ),
    ), {"labels.txt": labels})
    return [ensemble, preprocess, classifier]


def resnet50_artifacts(weights: str | None, cache: Path) -> dict[str, Path]:
    """TorchScript and ONNX exports of ResNet-50, cached by the weights (or the exporter for random weights)."""
    from tritonpack.build import export_resnet50
    from tritonpack.cache import cached_dir

    source = Path(weights) if weights else Path(export_resnet50.__file__)
    settings = {"weights": str(weights or ""), "seed": export_resnet50.SEED, "opset": 17,
                "exporter": Path(export_resnet50.__file__).read_text()}
    out = cached_dir(cache, "resnet50", source, settings, lambda d: export_resnet50.export(d, weights))
    return {"torchscript": out / "model.pt", "onnx": out / "model.onnx"}


def inception_artifacts(graphdef: str | None, onnx: bool, cache: Path) -> dict[str, Path]:
    """The frozen Inception v3 graph (given or built offline) and, if asked, its ONNX conversion; cached."""
    from tritonpack.build import export_inception
    from tritonpack.cache import cached_dir

    source = Path(graphdef) if graphdef else Path(export_inception.__file__)
    settings = {"graphdef": str(graphdef or ""), "seed": export_inception.SEED, "onnx": onnx,
                "exporter": Path(export_inception.__file__).read_text()}
    out = cached_dir(cache, "inception-v3", source, settings, lambda d: export_inception.export(d, graphdef, onnx))
    return {"graphdef": out / "model.graphdef", **({"onnx": out / "model.onnx"} if onnx else {})}
