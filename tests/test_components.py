"""Model folders carry exactly the modules their model.py needs; contracts and I/O names."""

from __future__ import annotations

import re
import sys

import pytest

from tritonpack import contracts
from tritonpack.components import (
    MODELS_DIR,
    Artifact,
    StepSettings,
    framework_model,
    load_model_module,
    model_imports,
    model_sources,
)
from tritonpack.errors import SpecError
from tritonpack.spec import Tensor


def test_model_sources_are_model_and_what_it_imports_when_folder_is_built():
    assert sorted(model_sources("tokenizer")) == ["batched_requests.py", "model.py", "resident_memory.py",
                                                  "tokenize_text.py"]
    assert sorted(model_sources("mean_pooling")) == ["batched_requests.py", "model.py", "pooling.py",
                                                     "resident_memory.py"]
    assert sorted(model_sources("dali_runner")) == ["batched_requests.py", "image_header.py", "model.py",
                                                    "resident_memory.py", "serialized_pipeline.py"]


@pytest.mark.parametrize("framework", ["onnx", "openvino_ir", "torchscript", "graphdef"])
def test_framework_runner_gets_only_its_own_session_module_when_built_for_a_framework(framework, tmp_path):
    folder = framework_model("m", Artifact(framework, tmp_path / "x"), "portable", (Tensor("X", "TYPE_FP32", (-1,)),),
                             (Tensor("Y", "TYPE_FP32", (-1,)),), StepSettings(4, None))
    sessions = sorted(name for name in folder.files if name.endswith("_session.py"))
    runner = dict(folder.spec.parameters)["framework"]
    assert sessions == [f"1/{runner}_session.py"]
    assert (MODELS_DIR / "framework_runner" / f"{runner}_session.py").is_file()


@pytest.mark.parametrize("framework", ["openvino", "tensorrt_plan"])
def test_framework_model_is_refused_with_what_portable_runs_when_the_framework_has_no_portable_runner(
        framework, tmp_path):
    with pytest.raises(SpecError, match=rf"^model m: {framework} has no portable runner; the portable target runs "
                                        r"onnx, openvino_ir, torchscript, graphdef$"):
        framework_model("m", Artifact(framework, tmp_path / "x"), "portable", (Tensor("X", "TYPE_FP32", (-1,)),),
                        (Tensor("Y", "TYPE_FP32", (-1,)),), StepSettings(4, None))


def test_model_imports_leave_sys_path_and_modules_as_they_were_when_the_block_ends():
    def from_models() -> list[str]:
        return [name for name, module in sys.modules.items()
                if str(getattr(module, "__file__", None) or "").startswith(str(MODELS_DIR))]

    path, before = list(sys.path), from_models()
    with model_imports("mean_pooling"):
        import pooling

        assert pooling.__file__.startswith(str(MODELS_DIR)) and "pooling" in from_models()
    assert sys.path == path and from_models() == before
    assert callable(load_model_module("tokenizer", "tokenize_text").TextTokenizer)
    assert sys.path == path and from_models() == before


def test_io_names_parse_input_and_output_when_given_as_in_colon_out():
    assert contracts.IoNames.parse("INPUT0:OUTPUT0") == contracts.IoNames("INPUT0", "OUTPUT0")
    assert str(contracts.IoNames("INPUT0", "OUTPUT0")) == "INPUT0:OUTPUT0"


@pytest.mark.parametrize(("text", "reason"), [
    ("INPUT0", "--io-names 'INPUT0': expected INPUT:OUTPUT"),
    ("A:A", "input and output are both named 'A'"),
    (":B", "tensor name '': use letters, digits"),
    ("a b:c", "tensor name 'a b': use letters, digits"),
])
def test_io_names_are_rejected_with_reason_when_malformed(text, reason):
    with pytest.raises(SpecError, match=re.escape(reason)):
        contracts.IoNames.parse(text)


def test_image_array_pads_rows_with_zeros_when_images_differ_in_length():
    batch = contracts.image_array([b"\xff\xd8abc", b"\x89P"])
    assert batch.shape == (2, 5) and batch.dtype.name == "uint8"
    assert bytes(batch[1]) == b"\x89P\x00\x00\x00"
