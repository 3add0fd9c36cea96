"""`resnet_trt`: DALI → ResNet-50 TensorRT plan (gpu; fp16 option, warmup at the largest batch) or the ONNX the
plan is built from (portable). A plan runs only on the GPU it was built for, so there is no cpu target."""

from __future__ import annotations

from tritonpack.spec import Tensor

from .image import IMAGENET_1000, Classifier, ImageRecipe

RECIPE = ImageRecipe(
    name="resnet_trt",
    preprocessing="resnet50",
    classifier=Classifier(
        model="resnet50",
        input=Tensor("input", "TYPE_FP32", (3, 224, 224)),  # the ONNX's (and so the plan's) tensor names
        output=Tensor("output", "TYPE_FP32", (1000,)),
        formats={"gpu": "tensorrt_plan", "portable": "onnx"},
    ),
    labels=IMAGENET_1000,
)
