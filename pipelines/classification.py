"""DALI preprocessing for image classification: encoded bytes → decoded RGB → resize/crop → normalised FP32.

Self-contained (imports only DALI and the standard library) because the `gpu` target ships this file's source as
the DALI backend's `1/dali.py`, which the backend serializes with `@autoserialize` on the GPU server at load time
(not run here: no GPU).

    pipe = classification_pipeline(recipe=RECIPES["resnet50"], device="cpu", batch_size=8, num_threads=2,
                                   device_id=None)

`device="gpu"` decodes with nvJPEG (`mixed`) and runs the rest on the GPU; `"cpu"` runs everything on the CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

INPUT_NAME = "IMAGE"  # like the DALI model's config input: external_source feeds it by name
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# A shorter-side resize of a long, thin image grows both sides (2000x1 → 512000x256: 390 MB from an 86-byte PNG).
# The longer side is capped at this many times the shorter side's target: up to this aspect ratio the resize is
# torchvision's; beyond it the image is squeezed along its longer side (where torchvision's answer differs).
MAX_ASPECT_RATIO = 64
MAX_MARGIN_DENOMINATOR = 1024


def _margin(central_fraction: float) -> Fraction:
    """The margin a central crop leaves on each side, as the exact fraction the float holds (0.875: 1/16)."""
    return Fraction((1.0 - central_fraction) / 2)


@dataclass(frozen=True)
class Recipe:
    """How one model family's training preprocessing turns an RGB image into its input tensor, to the pixel.

    resize_shorter > 0: torchvision's eval transform — `Resize(resize_shorter)` (the longer side truncated to
    int(resize_shorter * long / short), bilinear, antialiased), then `CenterCrop(size)` (offsets rounded half to
    even, as Python's round).
    central_fraction < 1: TF-slim's `preprocess_for_eval` — `tf.image.central_crop` (the margin truncated to whole
    pixels), then TF1's `resize_bilinear(align_corners=False)` to `size` x `size` (aspect not kept, no
    antialiasing, source = destination * scale without half-pixel centers).
    Both read the pixels as stored: EXIF orientation is not applied, as neither PIL's `Image.open` nor
    `tf.image.decode_jpeg` applies it.
    Output = (pixel - mean) / std per channel, FP32, in `layout` ("HWC" or "CHW").
    """

    size: int
    layout: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize_shorter: int = 0
    central_fraction: float = 1.0

    def __post_init__(self) -> None:
        if self.layout not in ("HWC", "CHW"):
            raise ValueError(f"layout must be HWC or CHW, got {self.layout!r}")
        if bool(self.resize_shorter) == (self.central_fraction < 1.0):
            raise ValueError("set exactly one of resize_shorter or central_fraction < 1")
        if self.resize_shorter and self.resize_shorter < self.size:
            raise ValueError("resize_shorter must be >= size")
        if not self.resize_shorter and _margin(self.central_fraction).denominator > MAX_MARGIN_DENOMINATOR:
            raise ValueError(f"central_fraction {self.central_fraction}: its margin (1 - fraction) / 2 must be a "
                             f"binary fraction such as 1/16 (0.875), so that integer pixel arithmetic equals "
                             f"TensorFlow's")

    @property
    def output_dims(self) -> tuple[int, int, int]:
        return (self.size, self.size, 3) if self.layout == "HWC" else (3, self.size, self.size)

    def as_kwargs(self) -> dict:
        return asdict(self)


RECIPES = {
    # TF-slim inception_preprocessing (eval): central_crop(0.875), resize_bilinear to 299x299, then scale
    # [0, 255] to [-1, 1]. NHWC as the graphdef's `input` expects.
    "inception_v3": Recipe(size=299, layout="HWC", mean=(127.5,) * 3, std=(127.5,) * 3, central_fraction=0.875),
    # torchvision ImageNet eval transform: Resize(256), CenterCrop(224), ImageNet mean/std. NCHW as the traced
    # ResNet-50 expects.
    "resnet50": Recipe(size=224, layout="CHW", mean=IMAGENET_MEAN, std=IMAGENET_STD, resize_shorter=256),
}


def preprocess(encoded, recipe: Recipe, device: str = "cpu"):
    """The DALI graph for one recipe; `encoded` is a DataNode of 1-D uint8 samples (JPEG, PNG, ...). Sizes and
    offsets are computed per image, in integers, from the header (`peek_image_shape`, on the CPU)."""
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be cpu or gpu, got {device!r}")
    # output_type RGB: grayscale is replicated to 3 channels, CMYK converted, PNG alpha dropped.
    images = fn.decoders.image(encoded, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB,
                               adjust_orientation=False)
    shape = fn.peek_image_shape(encoded, adjust_orientation=False)  # [height, width, channels]
    height, width = shape[0], shape[1]
    if recipe.resize_shorter:
        images = _torchvision_resize_center_crop(images, height, width, recipe)
    else:
        images = _tf_slim_central_crop_resize(images, height, width, recipe)
    return fn.crop_mirror_normalize(images, mean=list(recipe.mean), std=list(recipe.std), dtype=types.FLOAT,
                                    output_layout=recipe.layout)


def _torchvision_resize_center_crop(images, height, width, recipe: Recipe):
    short, long = dmath.min(height, width), dmath.max(height, width)
    new_long = dmath.min((long * recipe.resize_shorter) // short, recipe.resize_shorter * MAX_ASPECT_RATIO)
    wide = fn.cast(width > height, dtype=types.INT64)
    new_width = wide * new_long + (1 - wide) * recipe.resize_shorter
    new_height = (1 - wide) * new_long + wide * recipe.resize_shorter
    images = fn.resize(images, resize_x=fn.cast(new_width, dtype=types.FLOAT),
                       resize_y=fn.cast(new_height, dtype=types.FLOAT), antialias=True,
                       interp_type=types.INTERP_LINEAR)

    def centered(extent):  # int(round((extent - size) / 2)), halves to even
        spare = extent - recipe.size
        half = spare // 2
        return half + (spare - 2 * half) * (half & 1)

    crop = fn.constant(idata=[recipe.size, recipe.size], dtype=types.INT64)
    return fn.slice(images, fn.stack(centered(new_height), centered(new_width)), crop, axes=[0, 1],
                    normalized_anchor=False, normalized_shape=False)


def _tf_slim_central_crop_resize(images, height, width, recipe: Recipe):
    margin = _margin(recipe.central_fraction)
    top, left = (height * margin.numerator) // margin.denominator, (width * margin.numerator) // margin.denominator
    crop_height, crop_width = height - 2 * top, width - 2 * left
    images = fn.slice(images, fn.stack(top, left), fn.stack(crop_height, crop_width), axes=[0, 1],
                      normalized_anchor=False, normalized_shape=False)
    # TF1's legacy mapping reads source pixel (destination × scale); DALI samples pixel centres, (d + 0.5) × scale
    # − 0.5 from the region's start: a region shifted by 0.5 − 0.5 × scale gives TF's samples.
    extent = fn.stack(fn.cast(crop_height, dtype=types.FLOAT), fn.cast(crop_width, dtype=types.FLOAT))
    start = 0.5 - 0.5 * extent / recipe.size
    return fn.resize(images, size=[recipe.size, recipe.size], roi_start=start, roi_end=start + extent,
                     roi_relative=False, antialias=False, interp_type=types.INTERP_LINEAR, dtype=types.FLOAT)


@pipeline_def
def classification_pipeline(recipe: Recipe, device: str = "cpu"):
    encoded = fn.external_source(name=INPUT_NAME, device="cpu", dtype=types.UINT8, ndim=1)
    return preprocess(encoded, recipe, device)
