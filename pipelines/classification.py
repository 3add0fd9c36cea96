"""DALI preprocessing for image classification: encoded bytes → decoded RGB → resize/crop → normalised FP32.

Self-contained (imports only DALI) because the `gpu` target ships this file's source as the DALI backend's
`1/dali.py`, which the backend serializes with `@autoserialize` on the GPU server at load time.

    pipe = classification_pipeline(recipe=RECIPES["resnet50"], device="cpu", batch_size=8, num_threads=2,
                                   device_id=None)

`device="gpu"` decodes with nvJPEG (`mixed`) and runs the rest on the GPU; `"cpu"` runs everything on the CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

INPUT_NAME = "IMAGE"  # like the DALI model's config input: external_source feeds it by name
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# A shorter-side resize of a long, thin image grows both sides (2000x1 → 512000x256: 390 MB from an 86-byte PNG).
# The longer side is capped at this many times the shorter side's target: any aspect ratio up to 64 resizes as
# torchvision does; beyond it the center crop does not fit and the image is refused as undecodable.
MAX_ASPECT_RATIO = 64


@dataclass(frozen=True)
class Recipe:
    """How one model family's training preprocessing turns an RGB image into its input tensor.

    resize_shorter > 0: scale so the shorter side is that long (keeping aspect), then center-crop `size`.
    central_fraction < 1: keep that central fraction of each side, then resize to `size` x `size`
    (aspect not kept), as TF-slim's eval preprocessing does.
    Output = (pixel - mean) / std per channel, FP32, in `layout` ("HWC" or "CHW").
    """

    size: int
    layout: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize_shorter: int = 0
    central_fraction: float = 1.0
    antialias: bool = True

    def __post_init__(self) -> None:
        if self.layout not in ("HWC", "CHW"):
            raise ValueError(f"layout must be HWC or CHW, got {self.layout!r}")
        if bool(self.resize_shorter) == (self.central_fraction < 1.0):
            raise ValueError("set exactly one of resize_shorter or central_fraction < 1")
        if self.resize_shorter and self.resize_shorter < self.size:
            raise ValueError("resize_shorter must be >= size")

    @property
    def output_dims(self) -> tuple[int, int, int]:
        return (self.size, self.size, 3) if self.layout == "HWC" else (3, self.size, self.size)

    def as_kwargs(self) -> dict:
        return asdict(self)


RECIPES = {
    # TF-slim inception_preprocessing (eval): central_crop(0.875), bilinear resize to 299x299 without
    # antialiasing, then scale [0, 255] to [-1, 1]. NHWC as the graphdef's `input` expects.
    "inception_v3": Recipe(size=299, layout="HWC", mean=(127.5,) * 3, std=(127.5,) * 3,
                           central_fraction=0.875, antialias=False),
    # torchvision ImageNet eval transform: Resize(256) (shorter side, bilinear, antialiased),
    # CenterCrop(224), ImageNet mean/std. NCHW as the traced ResNet-50 expects.
    "resnet50": Recipe(size=224, layout="CHW", mean=IMAGENET_MEAN, std=IMAGENET_STD, resize_shorter=256),
}


def preprocess(encoded, recipe: Recipe, device: str = "cpu"):
    """The DALI graph for one recipe; `encoded` is a DataNode of 1-D uint8 samples (JPEG, PNG, ...)."""
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be cpu or gpu, got {device!r}")
    # output_type RGB: grayscale is replicated to 3 channels, CMYK converted, PNG alpha dropped.
    images = fn.decoders.image(encoded, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)
    if recipe.central_fraction < 1.0:
        margin = (1.0 - recipe.central_fraction) / 2
        images = fn.slice(images, rel_start=(margin, margin), rel_shape=(recipe.central_fraction,) * 2,
                          axis_names="HW")
        images = fn.resize(images, resize_x=recipe.size, resize_y=recipe.size, antialias=recipe.antialias,
                           interp_type=types.INTERP_LINEAR)
    else:
        images = fn.resize(images, resize_shorter=recipe.resize_shorter, antialias=recipe.antialias,
                           interp_type=types.INTERP_LINEAR, max_size=recipe.resize_shorter * MAX_ASPECT_RATIO)
    return fn.crop_mirror_normalize(images, crop=(recipe.size, recipe.size), mean=list(recipe.mean),
                                    std=list(recipe.std), dtype=types.FLOAT, output_layout=recipe.layout)


@pipeline_def
def classification_pipeline(recipe: Recipe, device: str = "cpu"):
    encoded = fn.external_source(name=INPUT_NAME, device="cpu", dtype=types.UINT8, ndim=1)
    return preprocess(encoded, recipe, device)
