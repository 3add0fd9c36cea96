"""`dali_inception`: DALI (decode, central crop 87.5%, resize 299, scale to [-1, 1], NHWC) → Inception v3.

The classifier is the TF-slim frozen graph on `tensorflow_graphdef` (Triton containers up to 25.02, which
still ship the TensorFlow backend) or, with `--model-format onnx` (`MODEL_FORMAT=onnx`), the same graph
converted by tf2onnx on `onnxruntime_onnx` (any container). Tensor names are the graph's either way.
"""

from __future__ import annotations

from tritonpack.spec import Tensor

from .image import IMAGENET_1001, Classifier, ImageRecipe

RECIPE = ImageRecipe(
    name="dali_inception",
    preprocessing="inception_v3",
    classifier=Classifier(
        model="inception_v3",
        input=Tensor("input", "TYPE_FP32", (299, 299, 3)),
        output=Tensor("InceptionV3/Predictions/Softmax", "TYPE_FP32", (1001,)),
        formats={"gpu": "graphdef", "cpu": "graphdef", "portable": "graphdef"},
        alternatives=("onnx",),
    ),
    labels=IMAGENET_1001,
)
