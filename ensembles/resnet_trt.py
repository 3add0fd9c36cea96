"""`resnet_trt`: DALI → ResNet-50 TensorRT plan (gpu; fp16 option, warmup at batch 128) or its ONNX (portable)."""

from __future__ import annotations

from tritonpack.components import Artifact, ModelFolder, framework_model
from tritonpack.spec import ModelWarmup, Tensor, WarmupInput

from .image import IMAGENET_1000, SERVING, image_ensemble, resnet50_artifacts

NAME = "resnet_trt"
TARGETS = ("gpu", "portable")  # a plan runs only on the GPU it was built for; portable runs the plan's ONNX
RECIPE = "resnet50"
INPUT = Tensor("input", "TYPE_FP32", (3, 224, 224))  # the ONNX (and so the plan) tensor names
OUTPUT = Tensor("output", "TYPE_FP32", (1000,))


def models(request, cache) -> list[ModelFolder]:
    serving = SERVING[request.target].with_overrides(request.serving)
    onnx = resnet50_artifacts(request.weights, cache)["onnx"]
    options = {}
    artifact = Artifact("onnx", onnx)
    if request.target == "gpu":
        artifact = Artifact("tensorrt_plan", resnet50_plan(onnx, serving.max_batch_size, request.fp16, cache))
        # The seed warms the engine at the largest batch so the first real request does not pay for it.
        options["model_warmup"] = (ModelWarmup(f"batch_{serving.max_batch_size}", serving.max_batch_size,
                                               (WarmupInput(INPUT.name, INPUT.data_type, INPUT.dims),)),)
    classifier = framework_model(
        f"{NAME}_classifier", artifact, request.target, inputs=(INPUT,), outputs=(OUTPUT,),
        max_batch_size=serving.max_batch_size, dynamic_batching=serving.dynamic_batching,
        instances=serving.classifier_instances, labels=IMAGENET_1000, labelled_output=OUTPUT.name, **options,
    )
    return image_ensemble(NAME, RECIPE, classifier, IMAGENET_1000, request.target, serving, cache)


def resnet50_plan(onnx, max_batch_size: int, fp16: bool, cache):
    """Profile over batch 1..max_batch_size (optimised for half of it) at 3x224x224."""
    from tritonpack.build import build_tensorrt
    from tritonpack.build.build_tensorrt import ShapeProfile, TensorRTUnavailable

    shape = INPUT.dims
    profile = ShapeProfile(INPUT.name, (1, *shape), (max(1, max_batch_size // 2), *shape), (max_batch_size, *shape))
    plan = cache / f"{onnx.parent.name}-{'fp16' if fp16 else 'fp32'}-b{max_batch_size}.plan"
    if plan.exists():
        return plan
    try:
        return build_tensorrt.build_plan(onnx, plan, [profile], fp16=fp16)
    except TensorRTUnavailable as e:  # resnet_trt has no cpu target: say what to build instead
        reason = str(e).split(";")[0]
        raise TensorRTUnavailable(f"{reason}; build resnet_trt --target portable (runs the plan's ONNX) "
                                  "or resnet_pt for a CPU target") from None
