"""TensorRT is not installable here: what surrounds it is validated, and its absence is said in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tritonpack.build.build_tensorrt import ShapeProfile, TensorRTUnavailable, require_tensorrt
from tritonpack.builder import BuildRequest, build, default_target
from tritonpack.errors import ToolUnavailable

try:
    import tensorrt  # noqa: F401

    HAS_TENSORRT = True
except ImportError:
    HAS_TENSORRT = False

no_tensorrt = pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")


def test_shape_profile_parses_min_opt_max_when_given_cli_syntax():
    profile = ShapeProfile.parse("input_ids=1x1,32x128,64x256")
    assert (profile.name, profile.min, profile.opt, profile.max) == ("input_ids", (1, 1), (32, 128), (64, 256))


@pytest.mark.parametrize("text", ["x=1x1,2x2", "x=4x4,2x2,8x8", "x=1,2x2,3x3"])
def test_shape_profile_rejects_text_when_shapes_are_inconsistent(text):
    with pytest.raises(ValueError):
        ShapeProfile.parse(text)


@no_tensorrt
def test_build_tensorrt_stops_with_one_line_when_tensorrt_is_missing(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tritonpack.build.build_tensorrt", str(tmp_path / "m.onnx"),
                             str(tmp_path / "m.plan"), "--profile", "x=1x1,1x1,1x1"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: TensorRT is not installed (pip package `tensorrt`)"]
    with pytest.raises(TensorRTUnavailable):
        require_tensorrt()


@no_tensorrt
def test_bert_gpu_build_fails_clearly_when_tensorrt_is_missing(test_dist):
    with pytest.raises(ToolUnavailable, match=r"TensorRT is not installed .*; build bert for cpu or portable instead"):
        build(BuildRequest("bert", "gpu", dist=test_dist))


@no_tensorrt
def test_default_target_is_portable_with_reason_when_tensorrt_is_missing():
    target, reason = default_target()
    assert target == "portable"
    assert reason.startswith("TARGET=portable (") and "TensorRT" in reason
