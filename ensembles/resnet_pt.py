"""`resnet_pt`: DALI (decode, resize 256, crop 224, ImageNet mean/std, NCHW) → ResNet-50 TorchScript."""

from __future__ import annotations

from tritonpack.spec import Tensor

from .image import IMAGENET_1000, Classifier, ImageRecipe

RECIPE = ImageRecipe(
    name="resnet_pt",
    preprocessing="resnet50",
    # pytorch_libtorch: INPUT__0 → OUTPUT__0 (outputs of TorchScript models are named `<name>__<index>`).
    classifier=Classifier(
        model="resnet50",
        input=Tensor("INPUT__0", "TYPE_FP32", (3, 224, 224)),
        output=Tensor("OUTPUT", "TYPE_FP32", (1000,)),
        formats={"gpu": "torchscript", "cpu": "torchscript", "portable": "torchscript"},
    ),
    labels=IMAGENET_1000,
)
