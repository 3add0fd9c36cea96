"""`dali_inception`: DALI (decode, central crop 87.5%, resize 299, scale to [-1, 1], NHWC) → Inception v3.

The classifier is the TF-slim frozen graph on `tensorflow_graphdef` (Triton containers up to 25.02, which
still ship the TensorFlow backend) or, with `model_format="onnx"` (`MODEL_FORMAT=onnx`), the same graph
converted by tf2onnx on `onnxruntime_onnx` (any container). Tensor names are the graph's either way.
"""

from __future__ import annotations

from tritonpack.components import Artifact, ModelFolder, framework_model
from tritonpack.spec import SpecError, Tensor

from .image import IMAGENET_1001, SERVING, image_ensemble, inception_artifacts

NAME = "dali_inception"
TARGETS = ("gpu", "cpu", "portable")
RECIPE = "inception_v3"
FORMATS = ("graphdef", "onnx")
INPUT = Tensor("input", "TYPE_FP32", (299, 299, 3))
OUTPUT = Tensor("InceptionV3/Predictions/Softmax", "TYPE_FP32", (1001,))


def models(request, cache) -> list[ModelFolder]:
    model_format = request.model_format or "graphdef"
    if model_format not in FORMATS:
        raise SpecError(f"{NAME}: model format {model_format!r} is not one of {', '.join(FORMATS)}")
    serving = SERVING[request.target].with_overrides(request.serving)
    artifacts = inception_artifacts(request.weights, model_format == "onnx", cache)
    classifier = framework_model(
        f"{NAME}_classifier", Artifact(model_format, artifacts[model_format]), request.target, inputs=(INPUT,),
        outputs=(OUTPUT,), max_batch_size=serving.max_batch_size, dynamic_batching=serving.dynamic_batching,
        instances=serving.classifier_instances, labels=IMAGENET_1001, labelled_output=OUTPUT.name,
    )
    return image_ensemble(NAME, RECIPE, classifier, IMAGENET_1001, request.target, serving, cache)
