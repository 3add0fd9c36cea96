"""DALI preprocessing (pipelines/ and the portable dali_runner) against independent PIL/numpy references.

Tolerance, in 8-bit grey levels. Both sides decode with libjpeg-turbo/libpng (identical pixels; CMYK and
grayscale converted to RGB alike) and both resample in floating point before rounding to uint8, so where the
sampling grids agree the filters' rounding leaves at most one grey level per value (measured: max exactly 1,
mean < 0.25). The grids agree for Inception (fixed 299x299 output) and for ResNet whenever the shorter-side
resize gives an integral long side. Otherwise DALI rounds the long side and keeps the exact shorter-side
scale, while PIL stretches to the rounded size: a sub-pixel (< 0.3 px) grid drift that moves a few values at
sharp edges by more (measured: 2 % of values, up to 14 levels, mean still < 0.25); there we require a mean
below 0.3 levels and 97 % of values within one level. A wrong crop offset, filter, channel order or
normalisation moves the mean to well above one level.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.fake_pb_utils import InferenceRequest, Tensor, TritonError
from tests.images import bad_payloads, image_kinds
from tritonpack.build.serialize_dali import serialize
from tritonpack.components import load_model_module
from tritonpack.pipelines.classification import RECIPES, Recipe, classification_pipeline

serialized_pipeline = load_model_module("dali_runner", "serialized_pipeline")
PipelineRunFailed, SerializedPipeline = serialized_pipeline.PipelineRunFailed, serialized_pipeline.SerializedPipeline
rows_to_samples = serialized_pipeline.rows_to_samples

MAX_GREY_LEVELS = 1.0 + 1e-3


def _rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")  # drops alpha, replicates grey, converts CMYK


def _round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def _bilinear_half_pixel(pixels: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Plain bilinear with half-pixel centers and no antialiasing (tf.image.resize / DALI antialias=False)."""

    def taps(n_out: int, n_in: int):
        x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(x).astype(int)
        return lo, np.minimum(lo + 1, n_in - 1), (x - lo)

    y0, y1, fy = taps(out_h, pixels.shape[0])
    x0, x1, fx = taps(out_w, pixels.shape[1])
    p = pixels.astype(np.float64)
    rows = p[y0] * (1 - fy)[:, None, None] + p[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return np.clip(np.floor(out + 0.5), 0, 255)


def reference_inception(data: bytes, recipe: Recipe) -> np.ndarray:
    """TF-slim eval: central 87.5% crop (start and end rounded half up), bilinear to 299x299, [-1, 1], HWC."""
    pixels = np.asarray(_rgb(data))
    h, w = pixels.shape[:2]
    margin = (1 - recipe.central_fraction) / 2
    top, left = _round_half_up(h * margin), _round_half_up(w * margin)
    bottom = _round_half_up(h * margin + h * recipe.central_fraction)
    right = _round_half_up(w * margin + w * recipe.central_fraction)
    resized = _bilinear_half_pixel(pixels[top:bottom, left:right], recipe.size, recipe.size)
    return (resized - np.array(recipe.mean)) / np.array(recipe.std)


def reference_resnet(data: bytes, recipe: Recipe) -> np.ndarray:
    """torchvision eval: Resize(256) with PIL bilinear (antialiased), CenterCrop(224), mean/std, CHW.

    The long side is rounded half up like DALI's (torchvision truncates it: 383 instead of 384 px for 640x427).
    """
    image = _rgb(data)
    w, h = image.size
    short = recipe.resize_shorter
    size = (short, _round_half_up(short * h / w)) if w <= h else (_round_half_up(short * w / h), short)
    image = image.resize(size, Image.BILINEAR)
    left, top = _round_half_up((size[0] - recipe.size) / 2), _round_half_up((size[1] - recipe.size) / 2)
    pixels = np.asarray(image.crop((left, top, left + recipe.size, top + recipe.size)), dtype=np.float64)
    return ((pixels - np.array(recipe.mean)) / np.array(recipe.std)).transpose(2, 0, 1)


REFERENCES = {"inception_v3": reference_inception, "resnet50": reference_resnet}


@pytest.fixture(scope="module")
def pipelines():
    built = {}
    for name, recipe in RECIPES.items():
        pipe = classification_pipeline(recipe=recipe, device="cpu", batch_size=16, num_threads=2, device_id=None,
                                       prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
        pipe.build()
        built[name] = pipe
    return built


def _run(pipe, images: list[bytes]) -> list[np.ndarray]:
    pipe.feed_input("IMAGE", [np.frombuffer(d, dtype=np.uint8) for d in images])
    out = pipe.run()[0]
    return [np.array(out[i]) for i in range(len(images))]


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_dali_preprocess_matches_pil_numpy_reference_within_one_grey_level_when_image_kinds_vary(recipe_name,
                                                                                                   pipelines):
    recipe = RECIPES[recipe_name]
    kinds = image_kinds()
    assert len(kinds) >= 8
    outputs = _run(pipelines[recipe_name], list(kinds.values()))
    channel_axis = -1 if recipe.layout == "HWC" else 0
    std = np.array(recipe.std).reshape((1, 1, 3) if channel_axis == -1 else (3, 1, 1))
    for (kind, data), out in zip(kinds.items(), outputs, strict=True):
        assert out.shape == recipe.output_dims and out.dtype == np.float32, kind
        grey_levels = np.abs(out - REFERENCES[recipe_name](data, recipe)) * std
        assert grey_levels.mean() < 0.3, f"{kind}: mean difference {grey_levels.mean():.3f} grey levels"
        if _same_sampling_grid(data, recipe):
            assert grey_levels.max() <= MAX_GREY_LEVELS, f"{kind}: off by {grey_levels.max():.2f} grey levels"
        else:
            assert (grey_levels > MAX_GREY_LEVELS).mean() <= 0.03, f"{kind}: too many values off by > 1 level"


def _same_sampling_grid(data: bytes, recipe: Recipe) -> bool:
    if not recipe.resize_shorter:
        return True
    w, h = _rgb(data).size
    return max(w, h) * recipe.resize_shorter % min(w, h) == 0


def test_dali_preprocess_gives_same_pixels_when_grayscale_png_or_its_rgb_copy(pipelines):
    grey = image_kinds()["png_grayscale_real_file"]
    rgb = io.BytesIO()
    _rgb(grey).save(rgb, "PNG")
    a, b = _run(pipelines["resnet50"], [grey, rgb.getvalue()])
    np.testing.assert_array_equal(a, b)


def test_serialized_pipeline_equals_live_pipeline_when_loaded_from_model_dali(tmp_path, pipelines):
    files = serialize("resnet50", tmp_path, max_batch_size=4, threads=1)
    runner = SerializedPipeline.from_file(str(files["model.dali"]), input_name="IMAGE", max_batch_size=4)
    images = list(image_kinds().values())[:6]  # more than max_batch_size: run in chunks
    for got, expected in zip(runner.run([np.frombuffer(d, np.uint8) for d in images]),
                             _run(pipelines["resnet50"], images), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_autoserialize_source_declares_recipe_and_gpu_device_when_written(tmp_path):
    source = serialize("inception_v3", tmp_path, max_batch_size=8, threads=3)["dali.py"].read_text()
    compile(source, "dali.py", "exec")
    assert "@autoserialize" in source and "batch_size=8, num_threads=3, device_id=0" in source
    assert f"Recipe(**{RECIPES['inception_v3'].as_kwargs()!r})" in source and 'device="gpu"' in source


def test_serialized_pipeline_recovers_when_a_sample_cannot_be_decoded(tmp_path):
    files = serialize("resnet50", tmp_path, max_batch_size=2, threads=1)
    runner = SerializedPipeline.from_file(str(files["model.dali"]), input_name="IMAGE", max_batch_size=2)
    good = np.frombuffer(image_kinds()["jpeg_baseline"], np.uint8)
    for bad in bad_payloads().values():
        with pytest.raises(PipelineRunFailed) as raised:
            runner.run([good, np.frombuffer(bad, np.uint8)])
        assert "Traceback" not in str(raised.value) and "\n" not in str(raised.value)
    assert runner.run([good])[0].shape == (3, 224, 224)


LONG_THIN_PROBE = """
import io, json, resource, sys
import numpy as np
from PIL import Image
sys.path.insert(0, sys.argv[1])
from serialized_pipeline import PipelineRunFailed, SerializedPipeline

runner = SerializedPipeline.from_file(sys.argv[2], input_name="IMAGE", max_batch_size=1)
answers = []
for size in ((64 * 256 // 224 * 2, 2), (2000, 1)):  # aspect 73: the crop still fits; 2000:1 it cannot
    image = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(image, "PNG")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        answers.append(list(runner.run([np.frombuffer(image.getvalue(), np.uint8)])[0].shape))
    except PipelineRunFailed:
        answers.append("refused")
    answers.append((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
print(json.dumps(answers))
"""


def test_serialized_pipeline_bounds_the_resize_when_an_image_is_long_and_thin(tmp_path):
    """A 2000x1 PNG is 86 bytes and far inside the pixel limit; resized to a shorter side of 256 it would be
    512,000x256 (390 MB, and 3.9 GB at 20000x1): the pipeline caps the longer side instead, and the crop refuses
    it."""
    import subprocess
    import sys

    files = serialize("resnet50", tmp_path, max_batch_size=1, threads=1)
    folder = str(Path(serialized_pipeline.__file__).parent)
    answers = json.loads(subprocess.run([sys.executable, "-c", LONG_THIN_PROBE, folder, str(files["model.dali"])],
                                  capture_output=True, text=True, check=True).stdout)
    fits, fits_grew_mb, refused, refused_grew_mb = answers
    assert fits == [3, 224, 224] and refused == "refused", answers
    assert fits_grew_mb < 100 and refused_grew_mb < 100, answers  # MB of peak memory each run added


def test_rows_to_samples_rejects_input_when_empty_or_wrong_dtype():
    with pytest.raises(ValueError, match="empty"):
        rows_to_samples(np.zeros((2, 8), np.uint8))
    with pytest.raises(ValueError, match="UINT8"):
        rows_to_samples(np.ones((1, 8), np.int32))
    assert [len(s) for s in rows_to_samples(np.ones((3, 5), np.uint8))] == [5, 5, 5]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"layout": "NHWC"}, "layout"),
    ({"resize_shorter": 256, "central_fraction": 0.875}, "exactly one"),
    ({"resize_shorter": 100}, "resize_shorter must be >= size"),
])
def test_recipe_rejects_settings_when_inconsistent(kwargs, message):
    base = {"size": 224, "layout": "CHW", "mean": (0.0,) * 3, "std": (1.0,) * 3, "resize_shorter": 256}
    with pytest.raises(ValueError, match=message):
        Recipe(**{**base, **kwargs})


def _padded(images: list[bytes]) -> np.ndarray:
    rows = np.zeros((len(images), max(len(d) for d in images)), np.uint8)
    for row, data in zip(rows, images, strict=True):
        row[:len(data)] = np.frombuffer(data, np.uint8)
    return rows


def test_dali_runner_model_fails_only_the_bad_request_when_batched_with_good_ones(model_folders, python_model):
    model = python_model(model_folders("resnet_pt", "portable")["resnet_pt_preprocess"])
    kinds = image_kinds()
    requests = [
        InferenceRequest([Tensor("IMAGE", _padded([kinds["jpeg_baseline"], kinds["png_rgba"]]))]),
        InferenceRequest([Tensor("IMAGE", _padded([bad_payloads()["truncated_jpeg"]]))]),
        InferenceRequest([Tensor("IMAGE", np.zeros((1, 16), np.uint8))]),
        InferenceRequest([Tensor("IMAGE", _padded([kinds["jpeg_cmyk"]]))]),
    ]
    responses = model.execute(requests)
    assert [r.has_error() for r in responses] == [False, True, True, False]
    for response in responses[1:3]:
        assert response.error().code() == TritonError.INVALID_ARG
    assert "could not be decoded" in responses[1].error().message()
    assert responses[0].output_tensors()[0].as_numpy().shape == (2, 3, 224, 224)
    assert responses[3].output_tensors()[0].as_numpy().shape == (1, 3, 224, 224)
