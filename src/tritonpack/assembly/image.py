"""An image recipe rendered for a target: DALI preprocessing → classifier, with the label file on the ensemble's
scores so Triton's classification extension answers with labels."""

from __future__ import annotations

from pathlib import Path

from tritonpack import contracts
from tritonpack.build.build_tensorrt import ShapeProfile, require_tensorrt, tensorrt_plan
from tritonpack.build.export_inception import inception_v3
from tritonpack.build.export_resnet50 import resnet50
from tritonpack.build.serialize_dali import dali_pipeline
from tritonpack.cache import ArtifactCache
from tritonpack.components import (
    Artifact,
    DaliPipeline,
    ModelFolder,
    StepSettings,
    dali_model,
    framework_model,
    given_plans,
)
from tritonpack.ensembles.image import Classifier, ImageRecipe, ImageServing
from tritonpack.errors import SpecError
from tritonpack.spec import LABELS_FILENAME, EnsembleStep, ModelSpec, ModelWarmup, Tensor, WarmupInput

PIXELS = "PIXELS"  # the preprocessed tensor between the two steps


def assemble(recipe: ImageRecipe, request, cache: ArtifactCache) -> list[ModelFolder]:
    serving = recipe.serving[request.target].with_overrides(request.serving)
    classifier = recipe.classifier
    fmt = classifier.formats[request.target]
    if request.model_format:
        if request.model_format not in (fmt, *classifier.alternatives):
            raise SpecError(f"{recipe.name}: model format {request.model_format!r} is not one of "
                            f"{', '.join((fmt, *classifier.alternatives))}")
        fmt = request.model_format
    weights = Path(request.weights) if request.weights else None
    if fmt == "tensorrt_plan" and request.plans:
        artifact = given_plans(dict(request.plans))
    else:
        artifact = classifier_artifact(classifier, fmt, weights, serving.max_batch_size, request.fp16, cache)
    options = {}
    if artifact.framework == "tensorrt_plan":  # warm the engine at the largest batch, as the seeds do
        options["model_warmup"] = (ModelWarmup(f"batch_{serving.max_batch_size}", serving.max_batch_size, (
            WarmupInput(classifier.input.name, classifier.input.data_type, classifier.input.dims),)),)
    step = StepSettings(serving.max_batch_size, serving.dynamic_batching, serving.classifier_instances,
                        labels=recipe.labels)
    model = framework_model(f"{recipe.name}_classifier", artifact, request.target, (classifier.input,),
                            (classifier.output,), step, **options)
    return image_ensemble(recipe, model, serving, request.target, cache, request.io_names or contracts.IMAGE)


def classifier_artifact(classifier: Classifier, fmt: str, weights: Path | None, max_batch_size: int, fp16: bool,
                        cache: ArtifactCache) -> Artifact:
    if classifier.model == "inception_v3":
        if fmt not in ("graphdef", "onnx"):
            raise SpecError(f"inception_v3 is built as graphdef or onnx, not {fmt}")
        folder = cache.get(inception_v3, graphdef=weights, onnx=fmt == "onnx")
        return Artifact(fmt, folder / ("model.onnx" if fmt == "onnx" else "model.graphdef"))
    if fmt == "tensorrt_plan":
        require_tensorrt()  # before the export it would build from
        onnx = cache.get(resnet50, weights=weights, fmt="onnx") / "model.onnx"
        shape = classifier.input.dims
        profile = ShapeProfile(classifier.input.name, (1, *shape), (max(1, max_batch_size // 2), *shape),
                               (max_batch_size, *shape))
        return Artifact(fmt, cache.get(tensorrt_plan, onnx=onnx, profiles=(profile,), fp16=fp16) / "model.plan")
    if fmt not in ("torchscript", "onnx"):
        raise SpecError(f"resnet50 is built as torchscript, onnx or tensorrt_plan, not {fmt}")
    folder = cache.get(resnet50, weights=weights, fmt=fmt)
    return Artifact(fmt, folder / ("model.pt" if fmt == "torchscript" else "model.onnx"))


def image_ensemble(recipe: ImageRecipe, classifier: ModelFolder, serving: ImageServing, target: str,
                   cache: ArtifactCache, io: contracts.IoNames = contracts.IMAGE) -> list[ModelFolder]:
    """[ensemble, DALI preprocessing, classifier]; the classifier has one input and its scores as first output."""
    from tritonpack.pipelines.classification import RECIPES

    pipeline = cache.get(dali_pipeline, recipe=recipe.preprocessing, max_batch_size=serving.max_batch_size,
                         threads=serving.dali_threads)
    image = contracts.image_input()
    preprocess = dali_model(
        f"{recipe.name}_preprocess", DaliPipeline(pipeline / "model.dali", pipeline / "dali.py"), target,
        inputs=(image,), outputs=(Tensor(PIXELS, "TYPE_FP32", RECIPES[recipe.preprocessing].output_dims),),
        settings=StepSettings(serving.max_batch_size, serving.dynamic_batching, threads=serving.dali_threads),
        runner_parameters={"max_image_pixels": str(serving.max_image_pixels)},
    )
    classes = sum(1 for line in recipe.labels.read_text().splitlines() if line.strip())
    scores = contracts.scores_output(classes, io.output)
    ensemble = ModelFolder(ModelSpec(
        name=recipe.name, platform="ensemble", max_batch_size=serving.max_batch_size,
        inputs=(contracts.image_input(io.input),), outputs=(scores,), labelled_output=scores.name,
        ensemble_steps=(
            EnsembleStep(preprocess.spec.name, {image.name: io.input}, {PIXELS: PIXELS}),
            EnsembleStep(classifier.spec.name, {classifier.spec.inputs[0].name: PIXELS},
                         {classifier.spec.outputs[0].name: scores.name}),
        ),
    ), {LABELS_FILENAME: recipe.labels})
    return [ensemble, preprocess, classifier]
