"""TensorRT is not installable here: what surrounds it is validated, and its absence is said in one line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tritonpack.build.build_tensorrt import ShapeProfile, TensorRTUnavailable, require_tensorrt
from tritonpack.builder import BuildRequest, build, default_target
from tritonpack.errors import SpecError, ToolUnavailable

try:
    import tensorrt  # noqa: F401

    HAS_TENSORRT = True
except ImportError:
    HAS_TENSORRT = False

no_tensorrt = pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")


def test_shape_profile_parses_min_opt_max_when_given_cli_syntax():
    profile = ShapeProfile.parse("input_ids=1x1,32x128,64x256")
    assert (profile.name, profile.min, profile.opt, profile.max) == ("input_ids", (1, 1), (32, 128), (64, 256))


@pytest.mark.parametrize(("text", "reason"), [
    ("x=1x1,2x2", "profile 'x=1x1,2x2': expected NAME=MIN,OPT,MAX"),
    ("x=4x4,2x2,8x8", "profile x: need min <= opt <= max on every axis"),
    ("x=1,2x2,3x3", "profile x: min/opt/max ranks differ"),
])
def test_shape_profile_rejects_text_when_shapes_are_inconsistent(text, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
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


def test_gpu_build_lists_one_plan_per_gpu_architecture_when_plans_are_given_per_compute_capability(tmp_path,
                                                                                                    test_dist,
                                                                                                    given_plan):
    from tritonpack.check import check
    from tritonpack.spec import parse_config

    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "cache").symlink_to(test_dist / "cache")
    plans = (("8.0", str(given_plan)), ("9.0", str(given_plan)))
    result = build(BuildRequest("resnet_trt", "gpu", plans=plans, dist=dist))
    folder = result.repository / "resnet_trt_classifier"
    config = parse_config((folder / "config.pbtxt").read_text())
    assert dict(config.cc_model_filenames) == {"8.0": "model_8_0.plan", "9.0": "model_9_0.plan"}
    assert sorted(p.name for p in (folder / "1").iterdir()) == ["model_8_0.plan", "model_9_0.plan"]
    report = check(result.tarball, deep=True)
    assert report.ok, report.problems
    assert any("TensorRT" in str(line) for line in report.unchecked)  # execution needs TensorRT: said, not hidden


def test_gpu_build_rejects_a_plan_with_reason_when_the_file_is_missing(tmp_path):
    with pytest.raises(SpecError, match="--plan: no such file"):
        build(BuildRequest("bert", "gpu", plans=(("", str(tmp_path / "nope.plan")),), dist=tmp_path))
    with pytest.raises(SpecError, match="for the gpu target"):
        BuildRequest("bert", "portable", plans=(("", str(tmp_path / "nope.plan")),))
