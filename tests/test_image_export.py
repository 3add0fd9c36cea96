"""Image model exports and what each target gets: graphdef/ONNX equivalence, contracts, DALI and TensorRT configs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tritonpack.build import export_inception
from tritonpack.builder import BuildRequest, build
from tritonpack.components import load_model_module
from tritonpack.errors import SpecError
from tritonpack.spec import parse_config
from tritonpack.wiring import wiring_problems

graphdef_session = load_model_module("framework_runner", "tensorflow_graphdef_session")
onnxruntime_session = load_model_module("framework_runner", "onnxruntime_session")

NAMES = {"input_order": export_inception.INPUT, "output_order": export_inception.OUTPUT, "threads": "2"}


def test_inception_onnx_equals_graphdef_when_converted_with_tf2onnx(artifact_cache):
    folder = artifact_cache.get(export_inception.inception_v3, graphdef=None, onnx=True)
    artifacts = {"graphdef": folder / "model.graphdef", "onnx": folder / "model.onnx"}
    images = export_inception.check_batch(3)
    tf_run = graphdef_session.open_session(str(artifacts["graphdef"]), NAMES)
    ort_run = onnxruntime_session.open_session(str(artifacts["onnx"]), {"threads": "2"})
    expected = tf_run({export_inception.INPUT: images})[export_inception.OUTPUT]
    actual = ort_run({export_inception.INPUT: images})[export_inception.OUTPUT]
    assert expected.shape == (3, 1001)
    assert ort_run.on_gpu is False  # CPUExecutionProvider only here (the runner weighs padding against calls on CUDA)
    np.testing.assert_allclose(expected.sum(axis=1), 1.0, rtol=1e-4)  # softmax probabilities
    assert np.abs(actual - expected).max() / np.abs(expected).max() <= 1e-4


def test_export_inception_rejects_graph_when_contract_names_are_missing(tmp_path):
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 299, 299, 3], name="images")
        tf.identity(images, name="probabilities")
    path = tmp_path / "other.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(SpecError, match=f"--weights {path}: not a frozen TF-slim Inception v3 graph \\(no Placeholder "
                                        "named 'input'\\)"):
        export_inception.export(tmp_path / "out", graphdef=str(path))


@pytest.mark.parametrize(("content", "why"), [
    (b"not a graph", "Error parsing message"),  # protobuf's DecodeError ended in a traceback
    (b"", "no Placeholder named 'input'"),  # parses as an empty GraphDef; its ValueError ended in a traceback too
])
def test_cli_build_says_in_one_line_when_inception_weights_are_not_a_frozen_graph(content, why, tmp_path, test_dist,
                                                                                  capsys):
    from tritonpack.cli import main

    weights = tmp_path / "inception.pb"
    weights.write_bytes(content)
    dist = _dist_sharing_cache(tmp_path, test_dist)
    argv = ["build", "dali_inception", "--target", "portable", "--weights", str(weights), "--dist", str(dist)]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --weights {weights}: not a frozen TF-slim Inception v3 graph "
                                               f"({why}"), err


def _dist_sharing_cache(tmp_path, test_dist):
    """A dist folder of its own (so repositories other tests built stay as they are) on the shared export cache."""
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "cache").symlink_to((test_dist / "cache").resolve())
    return dist


def _configs(repository):
    return {p.parent.name: parse_config(p.read_text()) for p in repository.glob("*/config.pbtxt")}


@pytest.mark.parametrize(("target", "kind", "pipeline_file"), [("gpu", 1, "dali.py"), ("cpu", 2, "model.dali")])
def test_dali_step_uses_dali_backend_with_target_files_when_built_for_native_targets(target, kind, pipeline_file,
                                                                                    build_ensemble):
    repository = build_ensemble("resnet_pt", target).repository
    config = _configs(repository)["resnet_pt_preprocess"]
    assert config.backend == "dali" and config.instance_group[0].kind == kind  # KIND_GPU = 1, KIND_CPU = 2
    assert config.input[0].allow_ragged_batch
    assert [p.name for p in (repository / "resnet_pt_preprocess" / "1").iterdir()] == [pipeline_file]
    classifier = _configs(repository)["resnet_pt_classifier"]
    assert classifier.platform == "pytorch_libtorch" and classifier.max_batch_size == 128
    assert [t.name for t in classifier.input] == ["INPUT__0"] and [t.name for t in classifier.output] == ["OUTPUT__0"]


def test_dali_inception_serves_onnx_classifier_when_model_format_is_onnx(tmp_path, test_dist):
    dist = _dist_sharing_cache(tmp_path, test_dist)
    result = build(BuildRequest("dali_inception", "cpu", model_format="onnx", dist=dist))
    configs = _configs(result.repository)
    classifier = configs["dali_inception_classifier"]
    assert classifier.platform == "onnxruntime_onnx"
    assert (result.repository / "dali_inception_classifier" / "1" / "model.onnx").exists()
    assert wiring_problems(configs["dali_inception"], configs) == []


def test_dali_inception_rejects_model_format_when_unknown(tmp_path):
    with pytest.raises(SpecError, match="savedmodel"):
        build(BuildRequest("dali_inception", "portable", model_format="savedmodel", dist=tmp_path))


def test_resnet_trt_gpu_config_has_profile_and_warmup_at_128_when_plan_build_is_stubbed(tmp_path, test_dist,
                                                                                         monkeypatch):
    """TensorRT is absent here: the plan producer is stubbed, everything around it (profile, config, wiring) is real."""
    import tritonpack.assembly.image
    from tritonpack.cache import Producer

    def fake_plan(out_dir, onnx, profiles, fp16):  # the "plan" records what the builder asked for
        (out_dir / "model.plan").write_text(json.dumps({"onnx": onnx.name, "fp16": fp16,
                                                        "profiles": [dataclasses.asdict(p) for p in profiles]}))

    # its own kind: a real build never finds the stub's output in the shared cache
    monkeypatch.setattr(tritonpack.assembly.image, "tensorrt_plan", Producer("tensorrt-plan-stub", fake_plan))
    monkeypatch.setattr(tritonpack.assembly.image, "require_tensorrt", lambda: None)
    result = build(BuildRequest("resnet_trt", "gpu", fp16=True, dist=_dist_sharing_cache(tmp_path, test_dist)))
    asked = json.loads((result.repository / "resnet_trt_classifier" / "1" / "model.plan").read_text())
    (profile,) = asked["profiles"]
    assert (profile["name"], profile["min"], profile["max"]) == ("input", [1, 3, 224, 224], [128, 3, 224, 224])
    assert asked["fp16"] and asked["onnx"] == "model.onnx"
    configs = _configs(result.repository)
    classifier = configs["resnet_trt_classifier"]
    assert classifier.platform == "tensorrt_plan" and classifier.max_batch_size == 128
    assert classifier.instance_group[0].kind == 1  # KIND_GPU
    (warmup,) = classifier.model_warmup
    assert warmup.batch_size == 128 and list(warmup.inputs["input"].dims) == [3, 224, 224]
    assert warmup.inputs["input"].random_data
    assert wiring_problems(configs["resnet_trt"], configs) == []


def test_resnet_trt_build_stops_with_one_line_when_target_is_gpu_without_tensorrt(tmp_path, test_dist):
    import subprocess

    try:
        import tensorrt  # noqa: F401

        pytest.skip("TensorRT is installed")
    except ImportError:
        pass
    dist = _dist_sharing_cache(tmp_path, test_dist)
    result = subprocess.run([sys.executable, "-m", "tritonpack.cli", "build", "resnet_trt", "--target", "gpu",
                             "--dist", str(dist)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "TensorRT is not installed" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def tiny_resnet(tmp_path_factory):
    """A small random ResNet with the contract's 1000 classes, saved as a user's transformers folder would be."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    folder = tmp_path_factory.mktemp("tiny-resnet") / "resnet"
    torch.manual_seed(1)
    ResNetForImageClassification(ResNetConfig(num_labels=1000, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                              layer_type="basic")).save_pretrained(folder)
    return folder


def test_resnet_export_uses_transformers_folder_when_weights_is_a_folder(tiny_resnet, tmp_path):
    import onnxruntime as ort
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from tritonpack.build import export_resnet50

    saved = ResNetForImageClassification.from_pretrained(tiny_resnet).eval()
    BuildRequest("resnet_pt", "portable", weights=str(tiny_resnet))  # a folder is accepted, not only a file
    export_resnet50.export(tmp_path / "out", str(tiny_resnet), formats=("onnx",))
    pixels = export_resnet50.check_batch(2)
    with torch.inference_mode():
        expected = saved(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    session = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    actual = session.run(None, {export_resnet50.ONNX_NAMES[0]: pixels})[0]
    assert export_resnet50.max_rel_diff(expected, actual) <= export_resnet50.MAX_REL_DIFF
    assert json.loads((tmp_path / "out" / "export.json").read_text())["weights"] == f"transformers folder {tiny_resnet}"

    ResNetForImageClassification(ResNetConfig(num_labels=10, embedding_size=8, hidden_sizes=[8], depths=[1],
                                              layer_type="basic")).save_pretrained(tmp_path / "ten")
    with pytest.raises(SpecError, match="10 classes, expected 1000"):
        export_resnet50.load_module(str(tmp_path / "ten"))


def test_resnet_exports_print_only_their_result_line(tiny_resnet, tmp_path):
    """Tracing read every attribute of the transformers ResNet: `make ensemble NAME=resnet_pt` printed a FutureWarning
    about `is_gradient_checkpointing` and a `loss_type` notice around its one line (once per process: a fresh one)."""
    export = "import sys; from pathlib import Path; from tritonpack.build import export_resnet50; " \
             "export_resnet50.export(Path(sys.argv[1]), sys.argv[2])"
    done = subprocess.run([sys.executable, "-c", export, str(tmp_path / "out"), str(tiny_resnet)], check=True,
                          capture_output=True, text=True)
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"exported ResNet-50 (transformers folder {tiny_resnet}): "
                                                    "max rel diff {'torchscript': "), lines


def test_tensorflow_imports_without_its_startup_notices_and_keeps_what_else_it_writes(tmp_path):
    """TensorFlow 2.21 wrote "WARNING: All log messages before absl::InitializeLog() is called…" and "oneDNN custom
    operations are on…" to stderr twice per import, whatever TF_CPP_MIN_LOG_LEVEL said: `make ensemble
    NAME=dali_inception` and `tritonpack check --deep` printed them among their lines."""
    importing = "from tritonpack.quiet_tensorflow import import_tensorflow; import_tensorflow().constant(1)"
    real = subprocess.run([sys.executable, "-c", importing], check=True, capture_output=True, text=True)
    assert (real.stdout, real.stderr) == ("", "")

    fake = tmp_path / "tensorflow"  # the same notices, and a line that is not one of them, written to fd 2
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent("""
        import os
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
        os.write(2, b"I0000 00:00:1795900354.989666   17549 port.cc:153] oneDNN custom operations are on.\\n")
        os.write(2, b"E0000 00:00:1795900354.989666   17549 a failure the user must see\\n")
        constant = int
    """))
    stand_in = subprocess.run([sys.executable, "-c", importing], check=True, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert stand_in.stderr == "E0000 00:00:1795900354.989666   17549 a failure the user must see\n"


def test_resnet_torchscript_has_the_same_bytes_and_no_debug_records_whoever_calls_the_export(tiny_resnet, tmp_path):
    """torch.jit.save wrote `*.debug_pkl` members holding the traced sources' absolute paths and the caller's Python
    stack: an export called one function deeper gave another model.pt."""
    import zipfile

    import torch
    from transformers import ResNetForImageClassification

    from tritonpack.build import export_resnet50

    model = ResNetForImageClassification.from_pretrained(tiny_resnet).eval()
    export = textwrap.dedent("""
        import sys
        from pathlib import Path
        from tritonpack.build.export_resnet50 import export

        def from_a_build_script(*args, **kwargs):
            export(*args, **kwargs)

        caller = from_a_build_script if sys.argv[3] == "wrapped" else export
        caller(Path(sys.argv[1]), sys.argv[2], formats=("torchscript",))
    """)
    for caller in ("direct", "wrapped"):  # fresh processes, as two builds: one process would mangle the class names
        subprocess.run([sys.executable, "-c", export, str(tmp_path / caller), str(tiny_resnet), caller],
                       check=True, capture_output=True)
    direct, wrapped = tmp_path / "direct" / "model.pt", tmp_path / "wrapped" / "model.pt"
    assert direct.read_bytes() == wrapped.read_bytes()
    with zipfile.ZipFile(direct) as saved:
        assert saved.testzip() is None
        assert not [name for name in saved.namelist() if name.endswith(".debug_pkl")]
        assert {info.date_time for info in saved.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    pixels = torch.from_numpy(export_resnet50.check_batch(2))
    with torch.inference_mode():
        expected = model(pixel_values=pixels).logits.numpy()
        actual = torch.jit.load(str(direct))(pixels).numpy()
    assert export_resnet50.max_rel_diff(expected, actual) <= export_resnet50.MAX_REL_DIFF
