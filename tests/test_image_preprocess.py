"""DALI preprocessing (pipelines/ and the portable dali_runner) against the transforms each model was trained with:
torchvision's eval transform for ResNet (as torchvision computes it, on PIL: `benchmarks.images.pil_preprocess`) and
TF-slim's `preprocess_for_eval` for Inception (TensorFlow's own ops).

Tolerance, in 8-bit grey levels. Both sides decode with libjpeg-turbo/libpng (identical pixels; CMYK and grayscale
converted to RGB alike) and sample on the same grid (the same integer sizes and offsets). PIL's resampling rounds its
uint8 result, DALI's rounds once more in its own arithmetic: at most one grey level per value (measured: max exactly
1, mean < 0.25). TF-slim resizes floats, as the pipeline does: measured equal to < 0.001 levels. A wrong size, crop
offset, filter, channel order or normalisation moves values by many levels.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.images import pil_preprocess
from tests.fake_pb_utils import InferenceRequest, Tensor, TritonError
from tests.images import bad_payloads, encode, image_kinds
from tritonpack.build.serialize_dali import serialize
from tritonpack.components import load_model_module
from tritonpack.pipelines.classification import IMAGENET_MEAN, IMAGENET_STD, RECIPES, Recipe, classification_pipeline

serialized_pipeline = load_model_module("dali_runner", "serialized_pipeline")
PipelineRunFailed, SerializedPipeline = serialized_pipeline.PipelineRunFailed, serialized_pipeline.SerializedPipeline
rows_to_samples = serialized_pipeline.rows_to_samples

MAX_GREY_LEVELS = 1.0 + 1e-3


def _rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")  # drops alpha, replicates grey, converts CMYK


def reference_inception(data: bytes, recipe: Recipe) -> np.ndarray:
    """TF-slim `preprocess_for_eval` with TensorFlow's ops: central_crop(0.875), resize_bilinear(align_corners=False)
    to 299x299 on floats in [0, 1], then [-1, 1]; HWC."""
    import tensorflow as tf

    image = tf.image.convert_image_dtype(tf.constant(np.asarray(_rgb(data))), dtype=tf.float32)
    image = tf.image.central_crop(image, central_fraction=recipe.central_fraction)
    image = tf.compat.v1.image.resize_bilinear(image[None], [recipe.size, recipe.size], align_corners=False)[0]
    return ((image - 0.5) * 2.0).numpy()


def reference_resnet(data: bytes, recipe: Recipe) -> np.ndarray:
    assert (recipe.resize_shorter, recipe.size, recipe.mean, recipe.std) == (256, 224, IMAGENET_MEAN, IMAGENET_STD)
    return pil_preprocess(data)


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


def _varied_sizes() -> dict[str, bytes]:
    """Noise at sizes whose resize is not integral (a long side truncated, an odd spare for the crop), tall and
    wide, upscaled and down."""
    rng = np.random.default_rng(0)
    sizes = ((640, 427), (451, 300), (300, 451), (257, 999), (1000, 255), (225, 3000), (301, 300), (100, 80))
    images = {(w, h): Image.fromarray(rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), np.uint8))
              .resize((w, h), Image.BILINEAR) for w, h in sizes}
    varied = {f"noise_{w}x{h}": encode(image, "PNG") for (w, h), image in images.items()}
    for fmt in ("TIFF", "PPM", "JPEG2000"):  # the other formats DALI decodes, through its header read too
        varied[f"noise_451x300_{fmt.lower()}"] = encode(images[451, 300], fmt)
    varied["noise_451x300_webp"] = encode(images[451, 300], "WEBP", lossless=True)
    return varied


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_dali_preprocess_equals_the_training_transform_within_one_grey_level_when_images_vary(recipe_name,
                                                                                               pipelines):
    """Before, the pipeline rounded torchvision's truncated long side and its crop offset differently (640x427:
    mean 1.6, max 77 levels off) and resized Inception with half-pixel centres after a crop rounded half up (mean
    2.3, max 154): the references copied the pipeline's choices, so nothing caught it."""
    recipe = RECIPES[recipe_name]
    kinds = image_kinds() | _varied_sizes()
    assert len(kinds) >= 20
    names = list(kinds)
    outputs = [out for start in range(0, len(names), 16)
               for out in _run(pipelines[recipe_name], [kinds[n] for n in names[start:start + 16]])]
    channel_axis = -1 if recipe.layout == "HWC" else 0
    std = np.array(recipe.std).reshape((1, 1, 3) if channel_axis == -1 else (3, 1, 1))
    for name, out in zip(names, outputs, strict=True):
        assert out.shape == recipe.output_dims and out.dtype == np.float32, name
        grey_levels = np.abs(out - REFERENCES[recipe_name](kinds[name], recipe)) * std
        assert grey_levels.max() <= MAX_GREY_LEVELS, f"{name}: off by {grey_levels.max():.2f} grey levels"
        assert grey_levels.mean() < 0.25, f"{name}: mean difference {grey_levels.mean():.3f} grey levels"


def test_dali_preprocess_reads_pixels_as_stored_when_exif_says_rotate(pipelines):
    """Neither PIL's Image.open nor tf.image.decode_jpeg applies EXIF orientation; DALI's decoder did by default
    (a 600x400 photo with Orientation=6: mean 72 levels off torchvision's)."""
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (400, 600, 3), np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    rotated = io.BytesIO()
    image.save(rotated, "JPEG", quality=95, exif=exif)
    out = _run(pipelines["resnet50"], [rotated.getvalue()])[0]
    grey_levels = np.abs(out - reference_resnet(rotated.getvalue(), RECIPES["resnet50"])) * \
        np.array(IMAGENET_STD).reshape(3, 1, 1)
    assert grey_levels.max() <= MAX_GREY_LEVELS


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


def test_serialized_pipeline_answers_as_before_when_a_sample_could_not_be_decoded(tmp_path):
    files = serialize("resnet50", tmp_path, max_batch_size=2, threads=1)
    runner = SerializedPipeline.from_file(str(files["model.dali"]), input_name="IMAGE", max_batch_size=2)
    good = np.frombuffer(image_kinds()["jpeg_baseline"], np.uint8)
    answer = runner.run([good])[0]
    for bad in bad_payloads().values():
        with pytest.raises(PipelineRunFailed) as raised:
            runner.run([good, np.frombuffer(bad, np.uint8)])
        assert "Traceback" not in str(raised.value) and "\n" not in str(raised.value)
        assert "classification.py" not in str(raised.value) and "#" not in str(raised.value)
        assert np.array_equal(runner.run([good])[0], answer)


LONG_THIN_PROBE = """
import io, json, resource, sys
import numpy as np
from PIL import Image
sys.path.insert(0, sys.argv[1])
from serialized_pipeline import SerializedPipeline

runner = SerializedPipeline.from_file(sys.argv[2], input_name="IMAGE", max_batch_size=1)
answers = []
for size in ((2000, 1), (20000, 1)):
    image = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(image, "PNG")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    answers.append(list(runner.run([np.frombuffer(image.getvalue(), np.uint8)])[0].shape))
    answers.append((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
print(json.dumps(answers))
"""


def test_serialized_pipeline_bounds_the_resize_when_an_image_is_long_and_thin(tmp_path):
    """A 2000x1 PNG is 86 bytes and far inside the pixel limit; resized to a shorter side of 256 it would be
    512,000x256 (390 MB, and 3.9 GB at 20000x1): the pipeline caps the longer side at 64 times the shorter one."""
    import subprocess
    import sys

    files = serialize("resnet50", tmp_path, max_batch_size=1, threads=1)
    folder = str(Path(serialized_pipeline.__file__).parent)
    answers = json.loads(subprocess.run([sys.executable, "-c", LONG_THIN_PROBE, folder, str(files["model.dali"])],
                                  capture_output=True, text=True, check=True).stdout)
    shape_2000, grew_2000_mb, shape_20000, grew_20000_mb = answers
    assert shape_2000 == shape_20000 == [3, 224, 224], answers
    assert grew_2000_mb < 100 and grew_20000_mb < 100, answers  # MB of peak memory each run added


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
    assert responses[1].error().message() == (
        "IMAGE: not an image DALI decodes (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000), or truncated or damaged; "
        "the server log has the decoder's reason")  # was "Failed to decode sample #0 :", or "nvImageCodec '#17'"
    assert responses[0].output_tensors()[0].as_numpy().shape == (2, 3, 224, 224)
    assert responses[3].output_tensors()[0].as_numpy().shape == (1, 3, 224, 224)


def test_serialized_pipeline_runs_groups_whose_claimed_pixels_stay_within_the_budget():
    runs = serialized_pipeline._runs
    assert runs(5, 2, (), 0) == [range(0, 2), range(2, 4), range(4, 5)]
    assert runs(4, 8, (30, 30, 10, 60), 50) == [range(0, 1), range(1, 3), range(3, 4)]  # one above it runs alone
    assert runs(0, 8, (), 50) == []


BOMBS_PROBE = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[3])
import numpy as np
from serialized_pipeline import SerializedPipeline
from tests.reliability import hostile

bomb = np.frombuffer(hostile.png_bomb(7000, 7000), np.uint8)  # 49 M pixels from a few KB
runner = SerializedPipeline.from_file(sys.argv[2], input_name="IMAGE", max_batch_size=8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
shapes = [list(o.shape) for o in runner.run([bomb] * 8, [49_000_000] * 8, 50_000_000)]
print(json.dumps([shapes, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024]))
"""


def test_dali_runner_decodes_at_most_its_pixel_limit_at_once_when_a_request_carries_several_large_images(tmp_path):
    """Each image was checked alone, then a request's images decoded together: 8 PNG bombs at the limit grew the stub
    by 1.2 GB (128, the batch limit, ~19 GB), and DALI keeps its buffers."""
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    files = serialize("resnet50", tmp_path, max_batch_size=8, threads=1)
    folder = str(Path(serialized_pipeline.__file__).parent)
    shapes, grew_mb = json.loads(subprocess.run(
        [sys.executable, "-c", BOMBS_PROBE, folder, str(files["model.dali"]), str(PROJECT_ROOT)],
        capture_output=True, text=True, check=True).stdout)
    assert shapes == [[3, 224, 224]] * 8
    assert grew_mb < 700, grew_mb  # one image at a time: ~430 MB; eight together ~1.2 GB
