"""`tritonpack check --deep`: every native artifact against its config, as its Triton backend would check it.

Repositories come from the real builder (one build per session, shared with the golden tests). Broken variants are
copies in tmp (configs copied, artifacts hard-linked), without `manifest.json`, as a hand-assembled repository
would be, and with the ensemble wiring kept consistent, so the structural checks pass and only `--deep` can tell.
TensorRT cannot be installed here: `gpu` plans are fake files given to the build (`--plan`), which
`--deep` must report as not checked, and the plan rules run against an API-faithful fake `tensorrt` module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tests.conftest import FAKE_PLAN, NEEDS_TENSORRT
from tritonpack.archive import Problem
from tritonpack.check import ServerPython, deep_problems
from tritonpack.check import check as check_for_container
from tritonpack.cli import main
from tritonpack.repository import write_tarball
from tritonpack.server import local_python_has
from tritonpack.spec import parse_config, render_config

NATIVE = [("bert", "cpu"), ("bert", "gpu"), ("bert_pt", "cpu"), ("bert_pt", "gpu"), ("dali_inception", "cpu"),
          ("dali_inception", "gpu"), ("resnet_pt", "cpu"), ("resnet_pt", "gpu"), ("resnet_trt", "gpu")]


@pytest.fixture(scope="session")
def native_repository(build_ensemble, given_plan):
    """native_repository(name, target) → the built repository; TensorRT plans are given fake files (module doc)."""
    def _repository(name: str, target: str) -> Path:
        if target == "gpu" and name in NEEDS_TENSORRT:
            return build_ensemble(name, target, plans=(("", str(given_plan)),)).repository
        return build_ensemble(name, target).repository

    return _repository


def check(path: Path, **options):
    """`tritonpack check --local`: this file is about native models; the python steps (tokenizer, pooling) run in the
    local Python here, as in `tritonpack serve`, so they need no packed environment."""
    return check_for_container(path, server=ServerPython(local_python_has), **options)


def hand_assembled(source: Path, dest: Path) -> Path:
    """A copy of a built repository without its manifest: configs and sources copied, artifacts hard-linked."""
    def copy(src, dst):
        if src.endswith((".pbtxt", ".py")):
            return shutil.copy2(src, dst)
        return os.link(src, dst)

    shutil.copytree(source, dest, copy_function=copy)
    (dest / "manifest.json").unlink()
    return dest


def edit(repo: Path, model: str, change: Callable[[mc.ModelConfig], None]) -> None:
    path = repo / model / "config.pbtxt"
    config = parse_config(path.read_text())
    change(config)
    path.write_text(render_config(config))


def tensor(config: mc.ModelConfig, name: str):
    return next(t for t in [*config.input, *config.output] if t.name == name)


def rename(repo: Path, ensemble: str, model: str, old: str, new: str) -> None:
    """Rename a model's input or output and the ensemble step's map key that names it."""
    edit(repo, model, lambda c: setattr(tensor(c, old), "name", new))

    def remap(config):
        step = next(s for s in config.ensemble_scheduling.step if s.model_name == model)
        for mapping in (step.input_map, step.output_map):
            if old in mapping:
                mapping[new] = mapping.pop(old)
    edit(repo, ensemble, remap)


def set_field(repo: Path, changes: dict[tuple[str, str], dict]) -> None:
    """{(model, tensor): {field: value}} on the named inputs/outputs (dims given as a list)."""
    for (model, name), values in changes.items():
        def change(config, name=name, values=values):
            t = tensor(config, name)
            for key, value in values.items():
                if key == "dims":
                    del t.dims[:]
                    t.dims.extend(value)
                elif key == "data_type":
                    t.data_type = mc.DataType.Value(value)
                else:
                    setattr(t, key, value)
        edit(repo, model, change)


def add_output(repo: Path, model: str, name: str, dims: list[int], data_type: str = "TYPE_FP32") -> None:
    edit(repo, model, lambda c: c.output.add(name=name, data_type=mc.DataType.Value(data_type), dims=dims))


def set_kind(repo: Path, model: str, kind: str) -> None:
    edit(repo, model, lambda c: setattr(c.instance_group[0], "kind", mc.ModelInstanceGroup.Kind.Value(kind)))


def as_openvino(repo: Path) -> None:
    """bert's cpu encoder on Triton's openvino backend instead (what `--serving encoder_runtime=openvino` renders)."""
    def change(config):
        config.ClearField("platform")
        config.backend, config.default_model_filename = "openvino", "model.onnx"
    edit(repo, "bert_encoder", change)


def rewrite_file(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.unlink()  # replaced, never written through: artifacts are hard links to the build's files
    path.write_text(text.replace(old, new))


def swap_first_inputs(config) -> None:
    first, second = mc.ModelInput(), mc.ModelInput()
    first.CopyFrom(config.input[1])
    second.CopyFrom(config.input[0])
    config.input[0].CopyFrom(first)
    config.input[1].CopyFrom(second)


def traced_for_batch_1(repo: Path) -> None:
    """Replace the classifier with a TorchScript traced at batch 1 whose reshape kept that 1: it loads and answers
    one image per batch, whatever the batch (a common export mistake the dynamic batcher then exposes)."""
    import torch

    class FirstRowScores(torch.nn.Module):
        def forward(self, pixels):
            return pixels.reshape(1, -1)[:, :1000]

    path = repo / PT / "1" / "model.pt"
    path.unlink()
    torch.jit.trace(FirstRowScores(), torch.zeros(1, 3, 224, 224)).save(str(path))


@dataclass(frozen=True)
class Broken:
    """One rule: the repository it breaks, how, and the line `--deep` must print (`reason` is a part of it)."""

    repository: tuple[str, str]
    mutate: Callable[[Path], None]
    file: str
    field: str
    reason: str
    structural: bool = False  # found without --deep too (a missing file, an empty repository)


ENC, PT, TF, PRE = "bert_encoder", "resnet_pt_classifier", "dali_inception_classifier", "resnet_pt_preprocess"
TF_OUT = "InceptionV3/Predictions/Softmax"
CORPUS = {
    # onnxruntime_onnx
    "onnx_input_renamed": Broken(("bert", "cpu"), lambda r: rename(r, "bert", ENC, "input_ids", "ids"),
                                 f"{ENC}/1/model.onnx", "input[ids]", "unexpected inference input 'ids', allowed "
                                                                      "inputs are: attention_mask, input_ids, "
                                                                      "token_type_ids; onnxruntime_onnx refuses"),
    "onnx_output_added": Broken(("bert", "cpu"), lambda r: add_output(r, ENC, "pooled", [384]),
                                f"{ENC}/1/model.onnx", "output[pooled]", "unexpected inference output 'pooled'"),
    "onnx_input_count": Broken(("bert", "cpu"), lambda r: (  # token_type_ids dropped, unmapped where it is made
        edit(r, ENC, lambda c: c.input.pop()),
        edit(r, "bert", lambda c: (c.ensemble_scheduling.step[1].input_map.pop("token_type_ids"),
                                   c.ensemble_scheduling.step[0].output_map.pop("token_type_ids")))),
        f"{ENC}/1/model.onnx", "input", "configuration expects 2 inputs, model provides 3"),
    "onnx_input_dtype": Broken(("bert", "cpu"), lambda r: set_field(r, {
        (ENC, "input_ids"): {"data_type": "TYPE_INT32"}, ("bert_tokenizer", "input_ids"): {"data_type": "TYPE_INT32"}}),
        f"{ENC}/1/model.onnx", "input[input_ids].data_type",
        "configuration expects datatype TYPE_INT32 for input 'input_ids', model provides TYPE_INT64"),
    "onnx_output_dims": Broken(("bert", "cpu"), lambda r: set_field(r, {
        (ENC, "token_embeddings"): {"dims": [-1, 385]}, ("bert_pooling", "token_embeddings"): {"dims": [-1, 385]}}),
        f"{ENC}/1/model.onnx", "output[token_embeddings].dims",
        "the model expects 3 dimensions (shape [-1,-1,384]) but the model configuration specifies 3 dimensions "
        "(shape [-1,-1,385]"),
    "onnx_batch_axis_in_dims": Broken(("bert", "cpu"), lambda r: set_field(r, {
        (ENC, "input_ids"): {"dims": [-1, -1]}, ("bert_tokenizer", "input_ids"): {"dims": [-1, -1]}}),
        f"{ENC}/1/model.onnx", "input[input_ids].dims", "the model expects 2 dimensions (shape [-1,-1]) but the "
                                                        "model configuration specifies 3 dimensions"),
    "onnx_ragged": Broken(("bert", "cpu"), lambda r: set_field(r, {(ENC, "input_ids"): {"allow_ragged_batch": True}}),
                          f"{ENC}/1/model.onnx", "input[input_ids].allow_ragged_batch",
                          "configuration expects model provides input with shape [-1] for ragged input 'input_ids'"),
    # pytorch_libtorch
    "torchscript_output_dims": Broken(("resnet_pt", "cpu"), lambda r: set_field(r, {
        (PT, "OUTPUT__0"): {"dims": [999]}, ("resnet_pt", "SCORES"): {"dims": [999]}}),
        f"{PT}/1/model.pt", "output[OUTPUT__0].dims", "the model returns shape [2,1000] for a batch of 2 but the "
                                                       "config declares [-1,999]"),
    "torchscript_traced_for_batch_1": Broken(("resnet_pt", "cpu"), traced_for_batch_1, f"{PT}/1/model.pt",
                                             "output[OUTPUT__0].dims", "the model returns shape [1,1000] for a batch "
                                                                       "of 2 but the config declares [-1,1000]"),
    "torchscript_output_added": Broken(("resnet_pt", "cpu"), lambda r: add_output(r, PT, "OUTPUT__1", [1000]),
                                       f"{PT}/1/model.pt", "output[OUTPUT__1]",
                                       "refers to an output index which doesn't exist. This model has 1 outputs; the "
                                       "model loads, then pytorch_libtorch fails every request"),
    "torchscript_input_count": Broken(("resnet_pt", "cpu"), lambda r: (
        edit(r, PT, lambda c: c.input.add().CopyFrom(c.input[0]) or setattr(c.input[1], "name", "INPUT__1")),
        edit(r, "resnet_pt", lambda c: c.ensemble_scheduling.step[1].input_map.update({"INPUT__1": "PIXELS"}))),
        f"{PT}/1/model.pt", "input", "configuration expects 2 inputs, model provides 1"),
    "torchscript_output_dtype": Broken(("resnet_pt", "cpu"), lambda r: set_field(r, {
        (PT, "OUTPUT__0"): {"data_type": "TYPE_FP16"}, ("resnet_pt", "SCORES"): {"data_type": "TYPE_FP16"}}),
        f"{PT}/1/model.pt", "output[OUTPUT__0].data_type",
        "configuration expects datatype TYPE_FP16 for output 'OUTPUT__0', model provides TYPE_FP32"),
    "torchscript_input_rank": Broken(("resnet_pt", "cpu"), lambda r: set_field(r, {
        (PT, "INPUT__0"): {"dims": [3, 224]}, (PRE, "PIXELS"): {"dims": [3, 224]}}),
        f"{PT}/1/model.pt", "run", "forward() fails on inputs shaped from the config"),
    "torchscript_input_index": Broken(("resnet_pt", "cpu"), lambda r: rename(r, "resnet_pt", PT, "INPUT__0",
                                                                             "INPUT__1"),
                                      f"{PT}/1/model.pt", "input[INPUT__1]",
                                      "input 'INPUT__1' names forward() argument 1, but forward() takes 1 tensors"),
    "torchscript_config_order": Broken(("bert_pt", "cpu"), lambda r: (
        rename(r, "bert_pt", "bert_pt_encoder", "attention_mask", "mask"),
        edit(r, "bert_pt_encoder", swap_first_inputs)),
        "bert_pt_encoder/1/model.pt", "input[input_ids]",
        "'input_ids' (config position 1) reaches forward() argument 'attention_mask'"),
    # tensorflow_graphdef
    "graphdef_input_renamed": Broken(("dali_inception", "cpu"), lambda r: rename(r, "dali_inception", TF, "input",
                                                                                 "images"),
                                     f"{TF}/1/model.graphdef", "input[images]",
                                     "unexpected inference input 'images', allowed inputs are: input"),
    "graphdef_output_renamed": Broken(("dali_inception", "cpu"), lambda r: rename(
        r, "dali_inception", TF, TF_OUT, "InceptionV3/Predictions/Probabilities"),
        f"{TF}/1/model.graphdef", "output[InceptionV3/Predictions/Probabilities]",
        "unexpected inference output 'InceptionV3/Predictions/Probabilities': no node of that name"),
    "graphdef_input_layout": Broken(("dali_inception", "cpu"), lambda r: set_field(r, {
        (TF, "input"): {"dims": [3, 299, 299]}, ("dali_inception_preprocess", "PIXELS"): {"dims": [3, 299, 299]}}),
        f"{TF}/1/model.graphdef", "input[input].dims",
        "placeholder 'input': the model expects 4 dimensions (shape [-1,299,299,3])"),
    "graphdef_input_dtype": Broken(("dali_inception", "cpu"), lambda r: set_field(r, {
        (TF, "input"): {"data_type": "TYPE_FP16"},
        ("dali_inception_preprocess", "PIXELS"): {"data_type": "TYPE_FP16"}}),
        f"{TF}/1/model.graphdef", "input[input].data_type", "placeholder 'input' takes TYPE_FP32, the config sends "
                                                            "TYPE_FP16"),
    "graphdef_output_dims": Broken(("dali_inception", "cpu"), lambda r: set_field(r, {
        (TF, TF_OUT): {"dims": [1000]}, ("dali_inception", "SCORES"): {"dims": [1000]}}),
        f"{TF}/1/model.graphdef", f"output[{TF_OUT}].dims", "the model returns shape [2,1001] for a batch of 2 but "
                                                            "the config declares [-1,1000]"),
    # dali (model.dali on cpu, dali.py on gpu)
    "dali_input_renamed": Broken(("resnet_pt", "cpu"), lambda r: rename(r, "resnet_pt", PRE, "IMAGE", "ENCODED"),
                                 f"{PRE}/1/model.dali", "input[ENCODED]",
                                 "Configuration file contains config for ENCODED but such input is not present in the "
                                 "pipeline (external_source names: IMAGE)"),
    "dali_output_added": Broken(("resnet_pt", "cpu"), lambda r: add_output(r, PRE, "SIZE", [2], "TYPE_INT64"),
                                f"{PRE}/1/model.dali", "output", "The number of outputs specified in the DALI pipeline "
                                                                 "and the configuration file do not match. Model "
                                                                 "config outputs: 2, Pipeline outputs: 1"),
    "dali_input_dtype": Broken(("resnet_pt", "cpu"), lambda r: set_field(r, {
        (PRE, "IMAGE"): {"data_type": "TYPE_INT8"}, ("resnet_pt", "IMAGE"): {"data_type": "TYPE_INT8"}}),
        f"{PRE}/1/model.dali", "input[IMAGE].data_type", "Mismatch of data_type config for \"IMAGE\": TYPE_INT8 in "
                                                          "config, TYPE_UINT8 in pipeline"),
    "dali_input_ndim": Broken(("resnet_pt", "cpu"), lambda r: set_field(r, {
        (PRE, "IMAGE"): {"dims": [-1, -1]}, ("resnet_pt", "IMAGE"): {"dims": [-1, -1]}}),
        f"{PRE}/1/model.dali", "input[IMAGE].dims", "Mismatch in number of dimensions for \"IMAGE\": 2 defined in "
                                                    "config ([-1,-1]), 1 in pipeline"),
    "dali_output_layout": Broken(("resnet_pt", "cpu"), lambda r: set_field(r, {
        (PRE, "PIXELS"): {"dims": [224, 224, 3]}, (PT, "INPUT__0"): {"dims": [224, 224, 3]}}),
        f"{PRE}/1/model.dali", "output[PIXELS].dims", "the model returns shape [2,3,224,224] for a batch of 2 but "
                                                      "the config declares [-1,224,224,3]"),
    "dali_num_threads": Broken(("resnet_pt", "cpu"), lambda r: edit(
        r, PRE, lambda c: setattr(c.parameters["num_threads"], "string_value", "two")),
        f"{PRE}/1/model.dali", "parameters.num_threads", "'two' is not a positive number of CPU threads"),
    "dali_gpu_pipeline_on_cpu_instance": Broken(("resnet_pt", "gpu"), lambda r: set_kind(r, PRE, "KIND_CPU"),
                                                f"{PRE}/1/dali.py", "instance_group.kind",
                                                "the pipeline has GPU operators"),
    "dali_py_input_renamed": Broken(("resnet_pt", "gpu"), lambda r: rename(r, "resnet_pt", PRE, "IMAGE", "ENCODED"),
                                    f"{PRE}/1/dali.py", "input[ENCODED]",
                                    "Configuration file contains config for ENCODED but such input is not present"),
    "dali_py_without_autoserialize": Broken(("resnet_pt", "gpu"), lambda r: rewrite_file(
        r / PRE / "1" / "dali.py", "@autoserialize\n", ""),
        f"{PRE}/1/dali.py", "file", "Precisely one autoserialize function must exist in the module. Found none; "
                                    "dali refuses"),
    # it ended the check with its own exit status and no report
    "dali_py_exits": Broken(("resnet_pt", "gpu"), lambda r: rewrite_file(
        r / PRE / "1" / "dali.py", "@autoserialize\n", "raise SystemExit(0)\n@autoserialize\n"),
        f"{PRE}/1/dali.py", "file", "autoserializing the pipeline fails: SystemExit: 0; dali refuses"),
    # tensorrt_plan
    "plan_on_cpu_instance": Broken(("resnet_trt", "gpu"), lambda r: set_kind(r, "resnet_trt_classifier", "KIND_CPU"),
                                   "resnet_trt_classifier/1/model.plan", "instance_group.kind",
                                   "TensorRT backend supports only GPU device"),
    "plan_for_gpu_missing": Broken(("resnet_trt", "gpu"), lambda r: edit(
        r, "resnet_trt_classifier", lambda c: c.cc_model_filenames.update({"8.6": "model_sm86.plan"})),
        "resnet_trt_classifier/1/model_sm86.plan", "cc_model_filenames[8.6]",
        "missing: a GPU of compute capability 8.6 loads this file instead of model.plan", structural=True),
    # openvino
    "openvino_on_gpu_instance": Broken(("bert", "cpu"), lambda r: (as_openvino(r), set_kind(r, ENC, "KIND_GPU")),
                                       f"{ENC}/1/model.onnx", "instance_group.kind",
                                       "Triton OpenVINO backend supports only Kind CPU and AUTO"),
    # the repository as a whole
    "no_model_folder": Broken(("bert", "cpu"), lambda r: [shutil.rmtree(p) for p in r.iterdir() if p.is_dir()],
                              "REPO", "models", "no model folder (a folder with config.pbtxt and a version folder "
                                                "such as 1/): nothing would load", structural=True),
}


def _matches(problem: Problem, case: Broken, label: str) -> bool:
    file = label if case.file == "REPO" else case.file
    return problem.file == file and problem.field == case.field and case.reason in problem.reason


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_check_deep_names_backend_answer_when_config_disagrees_with_artifact(case, native_repository, tmp_path):
    broken = CORPUS[case]
    repo = hand_assembled(native_repository(*broken.repository), tmp_path / "repo")
    broken.mutate(repo)
    structural = check(repo)
    assert structural.ok != broken.structural, "\n".join(map(str, structural.problems))
    report = check(repo, deep=True)
    assert any(_matches(p, broken, repo.name) for p in report.problems), "\n".join(map(str, report.problems))


def test_check_deep_corpus_has_one_line_per_rule_when_listed():
    rules = [(c.file, c.field, c.reason) for c in CORPUS.values()]
    assert len(set(rules)) == len(rules) >= 20


def unchecked_lines(report) -> list[tuple[str, str]]:
    return sorted((p.file, p.field) for p in report.unchecked)


@pytest.mark.parametrize(("name", "target"), NATIVE)
def test_check_deep_passes_when_repository_is_built(name, target, native_repository):
    report = check(native_repository(name, target), deep=True)
    assert report.problems == []
    expected = {  # what cannot be checked without TensorRT or CUDA, one line each
        ("bert", "gpu"): [("bert_encoder/1/model.plan", "file")],
        ("resnet_trt", "gpu"): [("resnet_trt_classifier/1/model.plan", "file"),
                                ("resnet_trt_preprocess/1/dali.py", "run")],
        ("dali_inception", "gpu"): [("dali_inception_preprocess/1/dali.py", "run")],
        ("resnet_pt", "gpu"): [("resnet_pt_preprocess/1/dali.py", "run")],
    }
    assert unchecked_lines(report) == expected.get((name, target), [])


def test_check_deep_passes_when_encoder_runs_on_openvino_backend(native_repository, tmp_path):
    repo = hand_assembled(native_repository("bert", "cpu"), tmp_path / "repo")
    as_openvino(repo)
    assert check(repo, deep=True).problems == []


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if skip is None or not p.is_relative_to(skip)}


def test_check_deep_extracts_tarball_into_a_temporary_folder_only(native_repository, tmp_path, monkeypatch):
    import tritonpack.check.deep as deep

    repo = hand_assembled(native_repository("bert", "cpu"), tmp_path / "repo")
    rename(repo, "bert", ENC, "input_ids", "ids")
    tarball = write_tarball(repo, tmp_path / "upload" / "bert-cpu.tar.gz")
    temp_root, home, cwd = tmp_path / "tmp", tmp_path / "home", tmp_path / "cwd"
    for folder in (temp_root, home, cwd):
        folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    extracted_to = []

    def watched_extract(path, dest, wanted, limits):
        extracted_to.append(Path(dest))
        return extract_members(path, dest, wanted, limits)

    extract_members = deep.extract_members
    monkeypatch.setattr(deep, "extract_members", watched_extract)
    before = snapshot(tmp_path, skip=temp_root)
    report = check(tarball, deep=True)
    assert any(_matches(p, CORPUS["onnx_input_renamed"], tarball.name) for p in report.problems)
    [dest] = extracted_to
    assert dest.is_relative_to(temp_root) and not dest.exists()
    assert list(temp_root.iterdir()) == []
    assert snapshot(tmp_path, skip=temp_root) == before, "something was written outside the temporary folder"


def test_check_deep_writes_nothing_into_folder_when_it_imports_dali_py(native_repository, tmp_path):
    repo = hand_assembled(native_repository("resnet_pt", "gpu"), tmp_path / "repo")
    before = snapshot(repo)
    assert check(repo, deep=True).ok
    assert snapshot(repo) == before
    assert "autoserialize_mod" not in sys.modules


def test_deep_problems_returns_only_artifact_findings_when_structure_also_fails(native_repository, tmp_path):
    repo = hand_assembled(native_repository("bert", "cpu"), tmp_path / "repo")
    CORPUS["onnx_input_renamed"].mutate(repo)
    (repo / "stray").mkdir()
    problems = deep_problems(repo)
    assert [p.file for p in problems] == [f"{ENC}/1/model.onnx"]
    assert Problem("stray/config.pbtxt", "file", "missing: every top-level folder must be a model folder") in \
        check(repo, deep=True).problems


def test_check_structural_imports_no_framework_when_deep_is_not_asked(native_repository):
    code = ("import sys; from tritonpack.check import check; report = check(sys.argv[1]); "
            "print(sorted({'torch', 'tensorflow', 'onnxruntime', 'nvidia.dali', 'openvino'} & set(sys.modules))); "
            "sys.exit(0 if report.ok else 1)")
    result = subprocess.run([sys.executable, "-c", code, str(native_repository("resnet_pt", "cpu"))],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(
                                __file__).resolve().parent.parent / "src")})
    assert (result.returncode, result.stdout.strip()) == (0, "[]"), result.stderr


def test_check_deep_warns_when_cpu_pipeline_runs_on_gpu_instance(native_repository, tmp_path):
    repo = hand_assembled(native_repository("resnet_pt", "cpu"), tmp_path / "repo")
    set_kind(repo, PRE, "KIND_GPU")
    report = check(repo, deep=True)
    assert report.ok
    assert [(w.file, w.field) for w in report.warnings if w.file.endswith("model.dali")] == [
        (f"{PRE}/1/model.dali", "instance_group.kind")]


def test_check_deep_warns_when_torchscript_inputs_fall_back_to_config_order(native_repository, tmp_path):
    repo = hand_assembled(native_repository("bert_pt", "cpu"), tmp_path / "repo")
    rename(repo, "bert_pt", "bert_pt_encoder", "attention_mask", "mask")
    report = check(repo, deep=True)
    assert report.ok, report.problems
    [warning] = [w for w in report.warnings if w.file.endswith("model.pt")]
    assert "by config order (input_ids → input_ids, mask → attention_mask, token_type_ids → token_type_ids)" in \
        warning.reason


def test_check_cli_deep_prints_problems_and_what_was_not_checked(native_repository, tmp_path, capsys):
    repo = native_repository("resnet_trt", "gpu")
    assert main(["check", str(repo), "--deep", "--local"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("not checked: ")] == [
        "not checked: resnet_trt_classifier/1/model.plan: file: TensorRT is not installed here: the plan's bindings "
        "and profiles were not read and it was not run (executing a plan needs TensorRT on a GPU of the architecture "
        "it was built for)",
        "not checked: resnet_trt_preprocess/1/dali.py: run: a GPU pipeline (mixed or gpu operators): its "
        "external_source names, declared dtypes and output count were checked; it was not run, which needs CUDA"]
    broken = hand_assembled(native_repository("bert", "cpu"), tmp_path / "repo")
    CORPUS["onnx_output_added"].mutate(broken)
    assert main(["check", str(broken), "--deep", "--local"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{ENC}/1/model.onnx: output[pooled]: unexpected inference output 'pooled', allowed outputs are: "
        f"token_embeddings; onnxruntime_onnx refuses to load the model"]


def fake_tensorrt():
    """The part of TensorRT's Python API the plan rules use, faithful to TensorRT 10 (`tensorrt` cannot be
    installed here). A "plan" is JSON describing the engine: {"tensors": {name: [mode, dtype, shape]},
    "profiles": [{name: [min, opt, max]}]}; anything else does not deserialize, as a foreign plan would not."""
    import json
    import types

    import numpy as np

    trt = types.ModuleType("tensorrt")
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.DataType = types.SimpleNamespace(FLOAT="FLOAT", HALF="HALF", INT64="INT64")
    trt.nptype = {"FLOAT": np.float32, "HALF": np.float16, "INT64": np.int64}.__getitem__

    class Logger:
        ERROR = 1

        def __init__(self, severity):
            self.severity = severity

    class Engine:
        def __init__(self, spec):
            self.tensors, self.profiles = spec["tensors"], spec["profiles"]
            self.num_io_tensors, self.num_optimization_profiles = len(self.tensors), len(self.profiles)

        def get_tensor_name(self, index):
            return list(self.tensors)[index]

        def get_tensor_mode(self, name):
            return self.tensors[name][0]

        def get_tensor_dtype(self, name):
            return self.tensors[name][1]

        def get_tensor_shape(self, name):
            return tuple(self.tensors[name][2])

        def get_tensor_profile_shape(self, name, index):
            return [tuple(s) for s in self.profiles[index][name]]

    class Runtime:
        def __init__(self, logger):
            self.logger = logger

        def deserialize_cuda_engine(self, plan: bytes):
            try:
                return Engine(json.loads(plan))
            except ValueError:
                return None

    trt.Logger, trt.Runtime = Logger, Runtime
    return trt


def engine_plan(input_name="input", output_dtype="FLOAT", max_batch=128) -> bytes:
    import json

    return json.dumps({
        "tensors": {input_name: ["INPUT", "FLOAT", [-1, 3, 224, 224]], "output": ["OUTPUT", output_dtype, [-1, 1000]]},
        "profiles": [{input_name: [[1, 3, 224, 224], [max(1, max_batch // 2), 3, 224, 224], [max_batch, 3, 224, 224]]}],
    }).encode()


@pytest.mark.parametrize(("plan", "field", "reason"), [
    (engine_plan(), None, None),
    (engine_plan(input_name="images"), "input[input]", "input 'input' not found (the plan's tensors: images, output)"),
    (engine_plan(output_dtype="HALF"), "output[output].data_type",
     "unexpected datatype TYPE_FP16 for inference output 'output', expecting TYPE_FP32"),
    (engine_plan(max_batch=64), "max_batch_size", "128, but the plan's profiles accept batches of input 'input' up "
                                                  "to 64: no optimization profile takes a larger batch; the model "
                                                  "loads, then tensorrt_plan fails batches above 64"),
    (FAKE_PLAN, "file", "TensorRT cannot deserialize the plan"),
])
def test_check_deep_reads_plan_bindings_and_profiles_when_tensorrt_imports(plan, field, reason, native_repository,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())  # a fake: TensorRT cannot be installed here
    repo = hand_assembled(native_repository("resnet_trt", "gpu"), tmp_path / "repo")
    plan_path = repo / "resnet_trt_classifier" / "1" / "model.plan"
    plan_path.unlink()
    plan_path.write_bytes(plan)
    problems = [p for p in check(repo, deep=True).problems if p.file.endswith("model.plan")]
    if field is None:
        assert problems == []
    else:
        assert [(p.field, reason in p.reason) for p in problems] == [(field, True)], problems


def test_check_deep_reads_each_gpu_plan_when_config_lists_compute_capabilities(native_repository, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    repo = hand_assembled(native_repository("resnet_trt", "gpu"), tmp_path / "repo")
    version = repo / "resnet_trt_classifier" / "1"
    (version / "model.plan").unlink()
    (version / "model.plan").write_bytes(engine_plan())
    (version / "model_sm90.plan").write_bytes(engine_plan(max_batch=64))
    edit(repo, "resnet_trt_classifier", lambda c: c.cc_model_filenames.update({"9.0": "model_sm90.plan"}))
    assert [(p.file, p.field) for p in check(repo, deep=True).problems] == [
        ("resnet_trt_classifier/1/model_sm90.plan", "max_batch_size")]


def test_model_spec_renders_plan_per_compute_capability_when_given():
    from tritonpack.spec import ModelSpec, SpecError, Tensor

    fields = dict(name="c", platform="tensorrt_plan", max_batch_size=8, inputs=(Tensor("x", "TYPE_FP32", (3,)),),
                  outputs=(Tensor("y", "TYPE_FP32", (3,)),))
    spec = ModelSpec(**fields, cc_model_filenames={"9.0": "model_sm90.plan", "8.6": "model_sm86.plan"})
    assert dict(parse_config(spec.render()).cc_model_filenames) == {"8.6": "model_sm86.plan",
                                                                    "9.0": "model_sm90.plan"}
    assert "cc_model_filenames" not in ModelSpec(**fields).render()
    for bad in ({"sm86": "a.plan"}, {"8.6": "../a.plan"}, {"8.6": ""}):
        with pytest.raises(SpecError, match="cc_model_filenames"):
            ModelSpec(**fields, cc_model_filenames=bad)


def test_check_deep_refuses_a_torchscript_whose_graph_fixes_the_cpu_when_it_runs_on_the_gpu(native_repository,
                                                                                              tmp_path):
    """bert_pt's model.pt as exports before the thirty-sixth round traced it (transformers' mask moved to the tracing
    device): served on a GPU it failed every request. The CPU target runs it where it was traced."""
    import warnings

    import torch

    from tritonpack.build import torchscript
    from tritonpack.build.export_text_encoder import _load, check_inputs
    from tritonpack.build.text_source import SentenceTransformerSource

    source = SentenceTransformerSource.resolve(None)
    inputs = check_inputs(source)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about transformers' Python-level shape logic
        traced = torch.jit.trace(_load(source.path), tuple(torch.from_numpy(inputs[n]) for n in source.input_names),
                                 strict=False)
    for target in ("gpu", "cpu"):
        repo = hand_assembled(native_repository("bert_pt", target), tmp_path / target)
        assert check(repo, deep=True).ok  # as built now
        (repo / "bert_pt_encoder" / "1" / "model.pt").unlink()  # a hard link to the built artifact
        torchscript.save(traced, repo / "bert_pt_encoder" / "1" / "model.pt")
        report = check(repo, deep=True)
        if target == "cpu":
            assert report.ok, report.problems
            continue
        [problem] = report.problems
        assert (problem.file, problem.field) == ("bert_pt_encoder/1/model.pt", "file")
        assert problem.reason.startswith("its graph moves tensors to cpu whatever device they are on (fixed when it "
                                         "was traced), so on KIND_GPU forward() fails")


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_bert_pt_pooled_in_its_graph_passes_check_deep_on_the_native_targets(build_ensemble, target):
    """`--serving encoder_pooling=true` on cpu/gpu: pytorch_libtorch runs the pooled TorchScript, which check --deep
    loads and runs on the CPU against the config (output EMBEDDING__0, [384] per row); no pooling step."""
    repo = build_ensemble("bert_pt", target, serving=(("encoder_pooling", "true"),)).repository
    report = check(repo, deep=True)
    assert report.ok, report.problems
    assert report.models == ["bert_pt", "bert_pt_encoder", "bert_pt_tokenizer"]
    encoder = parse_config((repo / "bert_pt_encoder" / "config.pbtxt").read_text())
    assert encoder.platform == "pytorch_libtorch"
    assert [(o.name, list(o.dims)) for o in encoder.output] == [("EMBEDDING__0", [384])]
