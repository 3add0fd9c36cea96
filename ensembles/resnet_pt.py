"""`resnet_pt`: DALI (decode, resize 256, crop 224, ImageNet mean/std, NCHW) → ResNet-50 TorchScript."""

from __future__ import annotations

from tritonpack.components import Artifact, ModelFolder, framework_model
from tritonpack.spec import Tensor

from .image import IMAGENET_1000, SERVING, image_ensemble, resnet50_artifacts

NAME = "resnet_pt"
TARGETS = ("gpu", "cpu", "portable")
RECIPE = "resnet50"


def models(request, cache) -> list[ModelFolder]:
    serving = SERVING[request.target].with_overrides(request.serving)
    artifact = Artifact("torchscript", resnet50_artifacts(request.weights, cache)["torchscript"])
    # pytorch_libtorch: INPUT__0 → OUTPUT__0 (framework_model appends `__0` to the output name).
    classifier = framework_model(
        f"{NAME}_classifier", artifact, request.target, inputs=(Tensor("INPUT__0", "TYPE_FP32", (3, 224, 224)),),
        outputs=(Tensor("OUTPUT", "TYPE_FP32", (1000,)),), max_batch_size=serving.max_batch_size,
        dynamic_batching=serving.dynamic_batching, instances=serving.classifier_instances,
        labels=IMAGENET_1000, labelled_output="OUTPUT__0",
    )
    return image_ensemble(NAME, RECIPE, classifier, IMAGENET_1000, request.target, serving, cache)
