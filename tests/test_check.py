"""`tritonpack check`: a corpus of broken repositories, each failing with its exact file, field and reason."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tritonpack.archive import ArchiveLimits, Problem
from tritonpack.check import KnownEnvs, ServerPython, check
from tritonpack.cli import main
from tritonpack.containers import container_python
from tritonpack.repository import reproducible_gzip, sha256_file, write_tarball
from tritonpack.spec import EnsembleStep, ModelSpec, Tensor


def fake_env(path: Path, python: str, numpy: str | None = "1.26.4", system_site_packages: bool = False) -> Path:
    """A packed-env-shaped tarball (venv-pack layout) for `python`, with numpy `numpy` (none when None). Its bytes
    depend only on the arguments, as a build's do, so two calls give one environment's bytes."""
    site = f"lib/python{python}/site-packages"
    numpy_files = [(f"{site}/numpy/__init__.py", b""),
                   (f"{site}/numpy-{numpy}.dist-info/METADATA", b"Name: numpy\n")] if numpy else []
    pyvenv = f"home = /usr/bin\ninclude-system-site-packages = {str(system_site_packages).lower()}\n" \
             f"version = {python}.4\n"
    with path.open("wb") as raw, reproducible_gzip(raw, level=6) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in ((f"{site}/probe.py", b"X = 1\n"), ("pyvenv.cfg", pyvenv.encode()), *numpy_files):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, f"/usr/bin/python{python}"
        tar.addfile(link)
    return path


def specs(env: str | None = None) -> list[ModelSpec]:
    params = {"EXECUTION_ENV_PATH": env} if env else {}
    pre = ModelSpec("pre", backend="python", max_batch_size=8, inputs=(Tensor("TEXT", "TYPE_STRING", (1,)),),
                    outputs=(Tensor("IDS", "TYPE_INT64", (-1,)),), parameters=params)
    enc = ModelSpec("enc", platform="onnxruntime_onnx", max_batch_size=8, inputs=(Tensor("IDS", "TYPE_INT64", (-1,)),),
                    outputs=(Tensor("OUT", "TYPE_FP32", (4,)),))
    ens = ModelSpec("ens", platform="ensemble", max_batch_size=8, inputs=(Tensor("TEXT", "TYPE_STRING", (1,)),),
                    outputs=(Tensor("OUT", "TYPE_FP32", (4,)),),
                    ensemble_steps=(EnsembleStep("pre", {"TEXT": "TEXT"}, {"IDS": "ids"}),
                                    EnsembleStep("enc", {"IDS": "ids"}, {"OUT": "OUT"})))
    return [pre, enc, ens]


def write_repo(root: Path, env_python: str | None = None, manifest_python: str | None = "3.11") -> Path:
    env = "$$TRITON_MODEL_DIRECTORY/env.tar.gz" if env_python else None
    for spec in specs(env):
        (root / spec.name / "1").mkdir(parents=True)
        (root / spec.name / "config.pbtxt").write_text(spec.render())
    (root / "pre" / "1" / "model.py").write_text("import numpy\n")
    (root / "enc" / "1" / "model.onnx").write_bytes(b"onnx bytes")
    if env_python:
        fake_env(root / "pre" / "env.tar.gz", env_python)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    manifest = {"ensemble": "ens", "python_version": manifest_python, "sagemaker_triton_default_model_name": "ens",
                "sha256": {p.relative_to(root).as_posix(): sha256_file(p) for p in files}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def refresh_manifest(root: Path) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["sha256"] = {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*"))
                          if p.is_file() and p.name != "manifest.json"}
    (root / "manifest.json").write_text(json.dumps(manifest))


def bad_pbtxt(root):
    (root / "pre" / "config.pbtxt").write_text('name: "pre"\nbackend: "python"\nmax_batch_size: 8\nbogus: 1\n')


def missing_artifact(root):
    (root / "enc" / "1" / "model.onnx").unlink()
    (root / "enc" / "1" / "README").write_text("not the model")


def empty_version(root):
    (root / "pre" / "1" / "model.py").unlink()


def non_numeric_version(root):
    (root / "enc" / "1").rename(root / "enc" / "latest")


def two_ensembles(root):
    shutil.copytree(root / "ens", root / "ens2")
    rewrite(root / "ens2" / "config.pbtxt", 'name: "ens"', 'name: "ens2"')


def no_ensemble(root):
    shutil.rmtree(root / "ens")


def dtype_mismatch(root):
    rewrite(root / "enc" / "config.pbtxt", "TYPE_INT64", "TYPE_INT32")


def name_mismatch(root):
    rewrite(root / "enc" / "config.pbtxt", 'name: "enc"', 'name: "encoder"')


def missing_config(root):
    (root / "stray" / "1").mkdir(parents=True)
    (root / "stray" / "1" / "model.py").write_text("")


def env_escapes(root):
    rewrite(root / "pre" / "config.pbtxt", "$$TRITON_MODEL_DIRECTORY/env.tar.gz",
            "$$TRITON_MODEL_DIRECTORY/../../env.tar.gz")


def env_absolute(root):
    rewrite(root / "pre" / "config.pbtxt", "$$TRITON_MODEL_DIRECTORY/env.tar.gz", "/opt/envs/env.tar.gz")


def env_missing(root):
    (root / "pre" / "env.tar.gz").unlink()


def env_python_mismatch(root):
    fake_env(root / "pre" / "env.tar.gz", "3.10")


def artifact_changed(root):
    (root / "enc" / "1" / "model.onnx").write_bytes(b"other bytes")


def manifest_digests_malformed(root):
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["sha256"] = sorted(manifest.get("sha256") or ["enc/1/model.onnx"])  # a list: was an AttributeError
    (root / "manifest.json").write_text(json.dumps(manifest))


def append(root: Path, model: str, text: str) -> None:
    with open(root / model / "config.pbtxt", "a") as config:
        config.write(text + "\n")


def runner_file_missing(root):
    append(root, "pre", 'parameters { key: "reference" value { string_value: "reference.npz" } }')


def tokenizer_file_missing(root):
    append(root, "pre", 'parameters { key: "tokenizer" value { string_value: "tokenizer.json" } }')


def runner_file_outside(root):
    append(root, "pre", 'parameters { key: "artifact" value { string_value: "../model.onnx" } }')


def openvino_runner(root: Path, **params: str) -> None:
    append(root, "pre", "\n".join(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'
                                   for key, value in {"framework": "openvino", **params}.items()))


def precision_unknown(root):
    openvino_runner(root, precision="fp8")


def unread_ensemble_input(root):
    extra = 'input {\n  name: "EXTRA"\n  data_type: TYPE_FP32\n  dims: 1\n}\n'
    rewrite(root / "ens" / "config.pbtxt", "output {", extra + "output {")


def unread_step_output(root):
    rewrite(root / "pre" / "config.pbtxt", "output {", 'output {\n  name: "LENGTHS"\n  data_type: TYPE_INT64\n  '
                                                       'dims: 1\n}\noutput {')
    rewrite(root / "ens" / "config.pbtxt", 'output_map {\n      key: "IDS"', 'output_map {\n      key: "LENGTHS"\n'
                                                                          '      value: "lengths"\n    }\n    '
                                                                          'output_map {\n      key: "IDS"')


def pinned_version_missing(root):
    rewrite(root / "ens" / "config.pbtxt", 'model_name: "enc"\n    model_version: -1',
            'model_name: "enc"\n    model_version: 2')


def preferred_above_max(root):
    append(root, "enc", "dynamic_batching { preferred_batch_size: 16 }")


def output_without_dims(root):
    rewrite(root / "enc" / "config.pbtxt", "dims: 4\n", "")


def zero_dim(root):
    rewrite(root / "enc" / "config.pbtxt", "dims: 4\n", "dims: 0\n")


def ensemble_instance_group(root):
    append(root, "ens", "instance_group { kind: KIND_CPU count: 1 }")


def labels_missing(root):
    rewrite(root / "enc" / "config.pbtxt", "dims: 4\n", 'dims: 4\n  label_filename: "labels.txt"\n')


def labels_outside(root):
    rewrite(root / "enc" / "config.pbtxt", "dims: 4\n", 'dims: 4\n  label_filename: "../../labels.txt"\n')


def syntax_error(root):
    (root / "pre" / "1" / "model.py").write_text("import numpy\ndef initialize(self, args)\n    pass\n")


def single_quoted_ensemble(root):
    rewrite(root / "ens" / "config.pbtxt", 'platform: "ensemble"', "platform: 'ensemble'")


def negative_max_batch_size(root):
    rewrite(root / "enc" / "config.pbtxt", "max_batch_size: 8", "max_batch_size: -4")


def misspelled_platform(root):
    rewrite(root / "enc" / "config.pbtxt", 'platform: "onnxruntime_onnx"', 'platform: "onnxruntime_onx"')


def misspelled_backend(root):
    rewrite(root / "pre" / "config.pbtxt", 'backend: "python"', 'backend: "pyhton"')


def output_without_data_type(root):
    rewrite(root / "enc" / "config.pbtxt", "data_type: TYPE_FP32\n", "")


def output_without_name(root):
    rewrite(root / "enc" / "config.pbtxt", 'name: "OUT"', 'name: ""')


def preferred_without_batching(root):
    rewrite(root / "enc" / "config.pbtxt", "max_batch_size: 8", "max_batch_size: 0")
    append(root, "enc", "dynamic_batching { preferred_batch_size: 4 }")


def specific_version_missing(root):
    append(root, "enc", "version_policy { specific { versions: 2 } }")


def leading_zero_version(root):
    (root / "enc" / "1").rename(root / "enc" / "01")


def unicode_digit_version(root):
    (root / "enc" / "1").rename(root / "enc" / "\u00b2")  # '²'.isdigit(), but int('²') raises


def ensemble_text_in_comment(root):
    rewrite(root / "enc" / "config.pbtxt", 'name: "enc"',
            '# a step of the ensemble (platform: "ensemble")\nname: "enc"')


def ensemble_text_in_parameter(root):
    append(root, "enc", """parameters { key: "note" value { string_value: 'platform: "ensemble"' } }""")


def warmup_file_missing(root):
    append(root, "enc", 'model_warmup { name: "w" batch_size: 1 inputs { key: "IDS" value { data_type: TYPE_INT64 '
                        'dims: 4 input_data_file: "ids.bin" } } }')


def env_without_numpy(root):
    fake_env(root / "pre" / "env.tar.gz", "3.11", numpy=None)


ENV_FIELD = "parameters.EXECUTION_ENV_PATH"
NO_VERSION = "no numeric version folder (e.g. 1/)"
ENSEMBLE_TEXT = ('not an ensemble, but its text says platform: "ensemble" (in a comment or a string), which is how '
                 "SageMaker's front-end finds the ensemble: it may serve this model instead; remove that text")
CORPUS = {  # name → (mutation, needs an env in the repository, expected problem)
    "bad_pbtxt": (bad_pbtxt, False, Problem("pre/config.pbtxt", "line 4 column 1",
                                            'Message type "inference.ModelConfig" has no field named "bogus".')),
    "missing_artifact": (missing_artifact, False, Problem(
        "enc/1/model.onnx", "platform", "missing: onnxruntime_onnx loads model.onnx from each version folder")),
    "empty_version": (empty_version, False, Problem("pre/1", "version", "empty version folder")),
    "non_numeric_version": (non_numeric_version, False, Problem("enc", "version", NO_VERSION)),
    # Triton ignores a version folder with leading zeros, and one that is no ASCII number (core model_lifecycle.cc
    # VersionsToLoad)
    "leading_zero_version": (leading_zero_version, False, Problem("enc", "version", NO_VERSION)),
    "unicode_digit_version": (unicode_digit_version, False, Problem("enc", "version", NO_VERSION)),
    "specific_version_missing": (specific_version_missing, False, Problem(
        "enc/config.pbtxt", "version_policy", "selects none of the version folders (1): Triton loads no version")),
    "two_ensembles": (two_ensembles, False, Problem("REPO", "ensemble", "2 ensembles (ens, ens2); an MME tarball "
                                                                        "needs exactly one")),
    "no_ensemble": (no_ensemble, False, Problem("REPO", "ensemble", "2 model folders but no ensemble; the MME loads "
                                                                    "the folder whose config says platform: "
                                                                    "\"ensemble\"")),
    "dtype_mismatch": (dtype_mismatch, False, Problem("ens/config.pbtxt", "ensemble_scheduling.step[1] (enc)."
                                                      "input_map[IDS]", "tensor ids: pre.IDS gives TYPE_INT64, "
                                                                        "needs TYPE_INT32")),
    "name_mismatch": (name_mismatch, False, Problem("enc/config.pbtxt", "name", "'encoder' differs from its folder "
                                                                               "name 'enc'")),
    "missing_config": (missing_config, False, Problem("stray/config.pbtxt", "file", "missing: every top-level "
                                                                                     "folder must be a model folder")),
    "env_escapes": (env_escapes, True, Problem("pre/config.pbtxt", ENV_FIELD, "'$$TRITON_MODEL_DIRECTORY/../../"
                                                                              "env.tar.gz' leads outside the "
                                                                              "repository")),
    "env_absolute": (env_absolute, True, Problem("pre/config.pbtxt", ENV_FIELD, "'/opt/envs/env.tar.gz' must start "
                                                                                "with $$TRITON_MODEL_DIRECTORY/ so "
                                                                                "the env travels inside the "
                                                                                "repository")),
    "env_missing": (env_missing, True, Problem("pre/config.pbtxt", ENV_FIELD, "'$$TRITON_MODEL_DIRECTORY/env.tar."
                                                                              "gz': pre/env.tar.gz does not exist")),
    "env_python_mismatch": (env_python_mismatch, True, Problem(
        "pre/env.tar.gz", "python", "env has Python 3.10 but the target's stub runs 3.11 (manifest.json "
                                    "python_version)")),
    "runner_file_missing": (runner_file_missing, False, Problem(
        "pre/1/reference.npz", "parameters.reference", "missing: the python model opens this file from its version "
                                                       "folder at load")),
    "tokenizer_file_missing": (tokenizer_file_missing, False, Problem(
        "pre/1/tokenizer.json", "parameters.tokenizer", "missing: the python model opens this file from its version "
                                                        "folder at load")),
    "runner_file_outside": (runner_file_outside, False, Problem(
        "pre/1/../model.onnx", "parameters.artifact", "must name a file inside the version folder")),
    # what the OpenVINO runner's session refuses at load (models/framework_runner/openvino_session.py)
    "precision_unknown": (precision_unknown, False, Problem(
        "pre/config.pbtxt", "parameters.precision", "'fp8' is not one of fp32, bf16, bf16-guarded, mixed")),
    "artifact_changed": (artifact_changed, False, Problem("enc/1/model.onnx", "sha256", "differs from manifest.json "
                                                                                        "(changed after the build)")),
    "manifest_digests_malformed": (manifest_digests_malformed, False, Problem(
        "manifest.json", "sha256", "not an object of file path → SHA-256 hex digest")),
    # what tritonserver 2.51 refuses when it loads the ensemble (each verified on a copy of dist/bert-portable or
    # dist/resnet_pt-portable loaded in the local Triton; this repository's model.onnx is not a model)
    "unread_ensemble_input": (unread_ensemble_input, False, Problem(
        "ens/config.pbtxt", "input[EXTRA]", "no step reads this ensemble input (Triton refuses it)")),
    "unread_step_output": (unread_step_output, False, Problem(
        "ens/config.pbtxt", "ensemble_scheduling.step[0] (pre).output_map[LENGTHS]",
        "tensor lengths is neither read by a step nor an ensemble output (Triton refuses it)")),
    "pinned_version_missing": (pinned_version_missing, False, Problem(
        "ens/config.pbtxt", "ensemble_scheduling.step[1] (enc).model_version",
        "version 2 of enc has no folder (has [1]); -1 takes the latest")),
    "preferred_above_max": (preferred_above_max, False, Problem(
        "enc/config.pbtxt", "dynamic_batching.preferred_batch_size", "16 is not between 1 and max_batch_size 8")),
    "output_without_dims": (output_without_dims, False, Problem(
        "enc/config.pbtxt", "output[OUT].dims", "missing: every tensor must give its dims ([1] for one value)")),
    "zero_dim": (zero_dim, False, Problem(
        "enc/config.pbtxt", "output[OUT].dims", "[0]: each dimension must be >= 1, or -1 for a variable size")),
    "ensemble_instance_group": (ensemble_instance_group, False, Problem(
        "ens/config.pbtxt", "instance_group", "set on an ensemble, which Triton refuses (its steps set their own)")),
    "labels_missing": (labels_missing, False, Problem(
        "enc/labels.txt", "output[OUT].label_filename", "missing: Triton reads the labels file when it loads the "
                                                        "model")),
    # what Triton's python backend, its config validation or its SageMaker front-end refuse (each seen in the
    # local MME with Triton 2.51)
    "syntax_error": (syntax_error, False, Problem("pre/1/model.py", "line 2", "expected ':': Triton's python backend "
                                                                              "cannot import it")),
    "single_quoted_ensemble": (single_quoted_ensemble, False, Problem(
        "ens/config.pbtxt", "platform", 'SageMaker\'s front-end finds the ensemble by the text platform: "ensemble" '
                                        '(double quotes, no space before the colon) and would serve another model of '
                                        'the tarball: write it so')),
    "negative_max_batch_size": (negative_max_batch_size, False, Problem(
        "enc/config.pbtxt", "max_batch_size", "-4: must be 0 (no batching) or more")),
    "misspelled_platform": (misspelled_platform, False, Problem(
        "enc/config.pbtxt", "platform", "'onnxruntime_onx' is not a platform Triton knows (ensemble, "
                                        "onnxruntime_onnx, pytorch_libtorch, tensorflow_graphdef, "
                                        "tensorflow_savedmodel, tensorrt_plan); a backend goes in `backend`")),
    "misspelled_backend": (misspelled_backend, False, Problem(
        "pre/config.pbtxt", "backend", "'pyhton' is not a backend of the Triton container; did you mean 'python'?")),
    "labels_outside": (labels_outside, False, Problem(
        "enc/config.pbtxt", "output[OUT].label_filename", "'../../labels.txt' leads outside the repository")),
    # what Triton's config validation refuses (core model_config_utils.cc ValidateIOShape, ValidateModelConfig)
    "output_without_data_type": (output_without_data_type, False, Problem(
        "enc/config.pbtxt", "output[OUT].data_type", "missing: every tensor must give its data_type (e.g. TYPE_FP32)")),
    "output_without_name": (output_without_name, False, Problem(
        "enc/config.pbtxt", "output[0].name", "missing: every tensor must have a name")),
    "preferred_without_batching": (preferred_without_batching, False, Problem(
        "enc/config.pbtxt", "dynamic_batching.preferred_batch_size", "4 is not between 1 and max_batch_size 0")),
    "warmup_file_missing": (warmup_file_missing, False, Problem(
        "enc/warmup/ids.bin", "model_warmup[w].inputs[IDS].input_data_file",
        "missing: Triton reads the warmup data file when it loads the model")),
    # SageMaker's front-end searches each config's whole text for the ensemble
    "ensemble_text_in_comment": (ensemble_text_in_comment, False, Problem("enc/config.pbtxt", "platform",
                                                                          ENSEMBLE_TEXT)),
    "ensemble_text_in_parameter": (ensemble_text_in_parameter, False, Problem("enc/config.pbtxt", "platform",
                                                                              ENSEMBLE_TEXT)),
    # the stub imports numpy from the packed environment (python_backend README)
    "env_without_numpy": (env_without_numpy, True, Problem(
        "pre/env.tar.gz", "numpy", "missing: the python backend stub imports numpy from the packed environment; add "
                                   "numpy to it (envs/*/environment.yml)")),
}


def as_tarball(root: Path) -> Path:
    return write_tarball(root, root.with_name(root.name + ".tar.gz"))


@pytest.mark.parametrize("form", ["folder", "tarball"])
def test_check_passes_when_repository_is_well_formed(tmp_path, form):
    root = write_repo(tmp_path / "repo", env_python="3.11")
    report = check(root if form == "folder" else as_tarball(root))
    assert report.problems == [] and report.warnings == []
    assert (report.ok, report.ensemble, report.models) == (True, "ens", ["enc", "ens", "pre"])


def counted_env_inspections(monkeypatch) -> list[str]:
    """The packed environments `check` inflates from here on, by member name."""
    from tritonpack.check import tree

    inflated, inspect_env = [], tree.inspect_env

    def counted(fileobj, label, limits):
        inflated.append(label)
        return inspect_env(fileobj, label, limits)

    monkeypatch.setattr(tree, "inspect_env", counted)
    return inflated


def test_check_inflates_a_packed_environment_once_per_bytes_given_the_environments_it_knows(tmp_path, monkeypatch):
    """A gateway checks every tarball it admits; the ones built with one environment carry the same bytes of it. The
    known environment is hashed, not inflated again, and the report is the one a fresh check gives."""
    first = as_tarball(write_repo(tmp_path / "first", env_python="3.11"))
    second = as_tarball(write_repo(tmp_path / "second", env_python="3.11"))  # the same environment's bytes
    other = write_repo(tmp_path / "other", env_python="3.11")
    fake_env(other / "pre" / "env.tar.gz", "3.11", numpy="1.26.3")
    refresh_manifest(other)
    known, inflated = KnownEnvs(), counted_env_inspections(monkeypatch)
    reports = [check(tarball, known_envs=known) for tarball in (first, second, as_tarball(other))]
    assert inflated == ["pre/env.tar.gz", "pre/env.tar.gz"] and known.inspected == 2  # first's and other's
    assert [(r.problems, r.warnings) for r in reports] == [([], [])] * 3
    assert reports[1].envs == check(second).envs  # as a check without known environments reads it
    assert reports[2].envs["pre/env.tar.gz"].distributions["numpy"] == "1.26.3"


def test_check_still_hashes_a_known_environment_and_never_keeps_one_with_problems(tmp_path, monkeypatch):
    """Known bytes are recognised by their hash, so a manifest that disagrees is still caught; an environment the
    archive checks refuse is inflated again by every tarball carrying it, which is told its problem."""
    known = KnownEnvs()
    check(as_tarball(write_repo(tmp_path / "first", env_python="3.11")), known_envs=known)
    tampered = write_repo(tmp_path / "tampered", env_python="3.11")
    manifest = json.loads((tampered / "manifest.json").read_text())
    manifest["sha256"]["pre/env.tar.gz"] = "0" * 64
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    unsafe = write_repo(tmp_path / "unsafe", env_python="3.11")
    with tarfile.open(unsafe / "pre" / "env.tar.gz", "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("../outside.py"), io.BytesIO())
    refresh_manifest(unsafe)
    inflated = counted_env_inspections(monkeypatch)
    report = check(as_tarball(tampered), known_envs=known)
    assert [(p.file, p.reason) for p in report.problems] == [
        ("pre/env.tar.gz", "differs from manifest.json (changed after the build)")]
    assert inflated == []
    for _ in range(2):
        problems = check(as_tarball(unsafe), known_envs=known).problems
        assert problems and problems[0].file.startswith("pre/env.tar.gz:"), problems
    assert inflated == ["pre/env.tar.gz", "pre/env.tar.gz"]


@pytest.mark.parametrize("form", ["folder", "tarball"])
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_check_names_file_field_reason_when_repository_is_broken(tmp_path, case, form):
    mutate, with_env, expected = CORPUS[case]
    root = write_repo(tmp_path / "repo", env_python="3.11" if with_env else None)
    mutate(root)
    if case not in ("artifact_changed", "manifest_digests_malformed"):
        refresh_manifest(root)  # each case breaks exactly one thing
    path = root if form == "folder" else as_tarball(root)
    if expected.file == "REPO":
        expected = Problem(path.name, expected.field, expected.reason)
    report = check(path)
    assert expected in report.problems, "\n".join(map(str, report.problems))
    assert not report.ok


def test_check_compares_env_python_with_container_when_container_is_given(tmp_path):
    root = write_repo(tmp_path / "repo", env_python="3.11")
    [problem] = check(root, container="24.10").problems
    assert problem == Problem("pre/env.tar.gz", "python", "env has Python 3.11 but the target's stub runs 3.10 "
                                                          "(Triton container 24.10)")
    assert check(root, python="3.11").ok


@pytest.mark.parametrize("numpy, container, from_manifest, refused", [
    ("2.2.6", "24.10", False, True),  # the release of the local Triton (2.51), where the stub was seen to abort
    ("2.2.6", "24.09", True, True),  # the container the build names in manifest.json
    ("1.26.4", "24.10", False, False),
    ("2.2.6", "25.01", False, False),  # a later release: not known to fail
])
def test_check_refuses_numpy2_env_when_container_stub_binds_numpy1(tmp_path, numpy, container, from_manifest, refused):
    python = container_python(container)
    root = write_repo(tmp_path / "repo", env_python=python, manifest_python=python)
    fake_env(root / "pre" / "env.tar.gz", python, numpy=numpy)
    if from_manifest:
        manifest = json.loads((root / "manifest.json").read_text())
        (root / "manifest.json").write_text(json.dumps(manifest | {"build": {"container": container}}))
    refresh_manifest(root)
    report = check(as_tarball(root), container=None if from_manifest else container)
    expected = Problem("pre/env.tar.gz", "numpy", f"env has numpy {numpy}, but the python backend stub of Triton "
                                                  f"container {container} aborts with numpy 2: pin numpy<2 in "
                                                  f"envs/*/environment.yml and rebuild")
    assert report.problems == ([expected] if refused else [])


def test_check_rejects_env_when_packed_env_is_hostile(tmp_path):
    root = write_repo(tmp_path / "repo", env_python="3.11")
    with tarfile.open(root / "pre" / "env.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("../../escape.py")
        tar.addfile(info, io.BytesIO(b""))
    refresh_manifest(root)
    assert Problem("pre/env.tar.gz:../../escape.py", "path", "'..' leads outside the archive") in check(root).problems


def test_check_warns_when_more_than_five_model_folders(tmp_path):
    root = write_repo(tmp_path / "repo")
    for i in range(3):
        shutil.copytree(root / "enc", root / f"enc{i}")
        rewrite(root / f"enc{i}" / "config.pbtxt", 'name: "enc"', f'name: "enc{i}"')
    refresh_manifest(root)
    report = check(root)
    assert report.ok
    assert Problem("repo", "models", "6 model folders (more than 5): each loads in every MME instance that serves "
                                     "this target, slowing cold starts") in report.warnings


@pytest.mark.parametrize("batched, warned", [("pre", True), ("enc", False), ("pre alone", True)])
def test_check_warns_when_a_python_step_reading_client_bytes_batches_requests(tmp_path, batched, warned):
    """Triton's python backend fails a whole batch on one request with malformed BYTES framing; `enc` batches
    requests too, but reads the tensors `pre` made, not the client's. `pre alone`: a tarball of that one model."""
    root = write_repo(tmp_path / "repo")
    append(root, batched.split()[0], "dynamic_batching { }")
    if batched == "pre alone":
        for folder in ("enc", "ens"):
            shutil.rmtree(root / folder)
        (root / "manifest.json").unlink()
    else:
        refresh_manifest(root)
    report = check(as_tarball(root))
    expected = Problem("pre/config.pbtxt", "dynamic_batching",
                       "batches requests but reads the client's BYTES (TEXT): Triton's python backend fails every "
                       "request of a batch when one has malformed BYTES framing, so one bad client request fails its "
                       "neighbours; remove dynamic_batching unless every client is your own")
    assert report.ok and report.warnings == ([expected] if warned else [])


@pytest.mark.parametrize("source", [
    "import numpy\nfrom tokenizers import Tokenizer\n",
    # imports an `initialize` or a `with` block runs were not looked at: such a model failed at load in Triton
    "import numpy\nclass TritonPythonModel:\n    def initialize(self, args):\n        import tokenizers\n",
    "import contextlib\nwith contextlib.suppress(OSError):\n    import tokenizers\n",
], ids=["at-import", "in-initialize", "in-with"])
def test_check_refuses_python_model_importing_beyond_numpy_when_no_environment_carries_it(tmp_path, source):
    root = write_repo(tmp_path / "repo")
    (root / "pre" / "1" / "model.py").write_text(source)
    refresh_manifest(root)
    report = check(root)
    assert [(p.file, p.field) for p in report.problems] == [("pre/config.pbtxt", "parameters.EXECUTION_ENV_PATH")]
    assert "imports tokenizers, which the Triton container's Python lacks" in report.problems[0].reason
    assert check(root, server=ServerPython(lambda module: module == "tokenizers")).ok  # a server whose Python has it


def test_check_local_refuses_python_models_without_environment_when_this_python_has_numpy_2(tmp_path):
    """The local Triton (2.51) runs them in this Python, whose numpy 2 its stub cannot read (containers.py)."""
    root = write_repo(tmp_path / "repo")
    assert check(root, python="3.11", server=ServerPython(lambda module: True, "1.26.4")).ok
    (problem,) = check(root, python="3.11", server=ServerPython(lambda module: True, "2.5.2")).problems
    assert (problem.file, problem.field) == ("pre/config.pbtxt", "parameters.EXECUTION_ENV_PATH")
    assert "whose numpy 2.5.2 its python backend stub (Triton 2.51) reads wrongly" in problem.reason


def test_check_refuses_an_environment_when_it_lacks_what_the_model_imports(tmp_path):
    root = write_repo(tmp_path / "repo", env_python="3.11")
    (root / "pre" / "1" / "model.py").write_text("import numpy\nimport tokenizers\n")
    refresh_manifest(root)
    (problem,) = check(root).problems
    assert (problem.file, problem.field) == ("pre/config.pbtxt", "parameters.EXECUTION_ENV_PATH")
    assert problem.reason == "pre/env.tar.gz lacks tokenizers, which the model imports"


def test_check_stops_at_archive_problems_when_tarball_is_hostile(tmp_path):
    root = write_repo(tmp_path / "repo")
    tar = as_tarball(root)
    limits = ArchiveLimits(max_members=3)
    report = check(tar, limits)
    assert report.problems == [Problem("repo.tar.gz", "members", "more than 3 entries (limit max_members)")]


def test_check_cli_prints_one_line_per_problem_when_not_deployable(tmp_path, capsys):
    root = write_repo(tmp_path / "repo")
    dtype_mismatch(root)
    non_numeric_version(root)
    refresh_manifest(root)
    assert main(["check", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["enc: version: no numeric version folder (e.g. 1/)",
                   "ens/config.pbtxt: ensemble_scheduling.step[1] (enc).input_map[IDS]: tensor ids: pre.IDS gives "
                   "TYPE_INT64, needs TYPE_INT32"]


def test_check_cli_exits_zero_when_the_default_bert_tarball_is_checked(build_ensemble, capsys):
    """The default tarball: its environment packed for the default SageMaker Triton container's Python."""
    tarball = build_ensemble("bert", env=True).tarball
    capsys.readouterr()  # what the build printed, where this test is the first to build the tarball
    started = time.perf_counter()
    assert main(["check", str(tarball)]) == 0, capsys.readouterr().out
    assert time.perf_counter() - started < 60
    assert capsys.readouterr().out == ""


def empty_tarball(path: Path) -> Path:
    with tarfile.open(path, "w:gz"):
        pass
    return path


@pytest.mark.parametrize("form", ["folder", "tarball"])
def test_check_rejects_repository_when_it_has_no_model_folder(tmp_path, form):
    (tmp_path / "empty").mkdir()
    path = tmp_path / "empty" if form == "folder" else empty_tarball(tmp_path / "empty.tar.gz")
    report = check(path)
    assert report.problems == [Problem(path.name, "models", "no model folder (a folder with config.pbtxt and a "
                                                            "version folder such as 1/): nothing would load")]
    assert report.ensemble is None


def test_check_names_misplaced_config_when_tarball_holds_a_model_folders_contents(tmp_path):
    root = write_repo(tmp_path / "repo")
    contents = tmp_path / "contents"
    shutil.copytree(root / "enc", contents)  # config.pbtxt and 1/ at the top, as `tar -C enc .` makes
    report = check(as_tarball(contents))
    assert report.problems == [
        Problem("1/config.pbtxt", "file", "missing: every top-level folder must be a model folder"),
        Problem("config.pbtxt", "path", "a config at the top of the repository: each model needs its own folder, "
                                        "<name>/config.pbtxt with <name>/1/")]


def test_check_takes_the_only_model_as_entry_point_when_there_is_no_ensemble(tmp_path):
    root = write_repo(tmp_path / "repo")
    for name in ("pre", "ens"):
        shutil.rmtree(root / name)
    refresh_manifest(root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["sagemaker_triton_default_model_name"] = "enc"
    (root / "manifest.json").write_text(json.dumps(manifest))
    report = check(root)
    assert (report.problems, report.ensemble) == ([], "enc")


def test_check_requires_each_plan_listed_per_compute_capability_when_config_lists_them(tmp_path):
    root = write_repo(tmp_path / "repo")
    (root / "enc" / "1" / "model.onnx").rename(root / "enc" / "1" / "model_sm86.onnx")
    spec = next(s for s in specs() if s.name == "enc")
    listed = {"8.6": "model_sm86.onnx", "9.0": "model_sm90.onnx"}
    (root / "enc" / "config.pbtxt").write_text(replace(spec, cc_model_filenames=listed).render())
    refresh_manifest(root)
    report = check(root)
    assert report.problems == [Problem("enc/1/model_sm90.onnx", "cc_model_filenames[9.0]",
                                       "missing: a GPU of compute capability 9.0 loads this file instead of "
                                       "model.onnx")]
    (root / "enc" / "1" / "model_sm90.onnx").write_bytes(b"onnx bytes")
    refresh_manifest(root)
    report = check(root)
    assert report.problems == []
    assert Problem("enc/1/model.onnx", "platform", "missing: a GPU whose compute capability is not in "
                                                   "cc_model_filenames loads model.onnx") in report.warnings


def test_check_prints_a_member_name_that_is_not_utf8_escaped_when_stdout_is_strict(tmp_path):
    import subprocess
    import sys

    root = write_repo(tmp_path / "repo")
    (root / "v\udcff").mkdir()  # written as the byte 0xff: an invalid UTF-8 name
    (root / "v\udcff" / "x").write_bytes(b"x")
    tarball = as_tarball(root)
    result = subprocess.run([sys.executable, "-c", "import sys; from tritonpack.cli import main; sys.exit(main())",
                             "check", str(tarball)], capture_output=True,
                            env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert result.returncode == 1, result.stderr.decode()[-500:]
    assert b"v\\udcff/config.pbtxt: file: missing: every top-level folder must be a model folder" \
        in result.stdout.splitlines()


def test_check_warns_instead_of_refusing_when_a_newer_stub_python_may_parse_what_this_one_cannot(tmp_path):
    """`type` statements are Python 3.12: a 3.11 checker cannot parse them, the stub of a 3.12 container can."""
    root = write_repo(tmp_path / "repo", manifest_python="3.12")
    (root / "pre" / "1" / "model.py").write_text("import numpy\ntype Vector = list[float]\n")
    refresh_manifest(root)
    report = check(root, python="3.12")
    if sys.version_info >= (3, 12):
        assert report.ok and report.warnings == []
    else:
        assert report.ok and [(w.file, w.field) for w in report.warnings] == [("pre/1/model.py", "line 2")]
        assert "imports were not checked (the stub runs Python 3.12)" in report.warnings[0].reason
        assert not check(root, python="3.11").ok


@pytest.mark.parametrize("form", ["folder", "tarball"])
def test_check_passes_with_a_warning_when_a_model_has_folders_triton_skips(tmp_path, form):
    """Triton skips warmup/, initial_state/ and configs/ and only logs other folders that are not versions."""
    root = write_repo(tmp_path / "repo")
    append(root, "enc", 'model_warmup { name: "w" batch_size: 1 inputs { key: "IDS" value { data_type: TYPE_INT64 '
                        'dims: 4 input_data_file: "ids.bin" } } }')
    (root / "enc" / "warmup").mkdir()
    (root / "enc" / "warmup" / "ids.bin").write_bytes(bytes(32))
    for skipped in ("initial_state", "configs", ".ipynb_checkpoints"):
        (root / "enc" / skipped).mkdir()
        (root / "enc" / skipped / "x").write_bytes(b"x")
    refresh_manifest(root)
    report = check(root if form == "folder" else as_tarball(root))
    assert report.problems == []
    assert report.warnings == [Problem("enc/.ipynb_checkpoints", "version", "not a version folder (a number without "
                                                                            "leading zeros): Triton ignores it")]


@pytest.mark.parametrize("source, python, reason", [
    ("import numpy\nimport tomllib\n", "3.10", "has no tomllib (added in Python 3.11)"),
    ("import numpy\nimport distutils.core\n", "3.12", "has no distutils (removed in Python 3.12)"),
    ("import numpy\nimport tomllib\n", "3.11", None),
    ("import numpy\nimport imp\n", "3.10", None),  # in 3.10's standard library, whatever this interpreter's has
])
def test_check_judges_standard_imports_by_the_stub_python_when_it_is_known(tmp_path, source, python, reason):
    root = write_repo(tmp_path / "repo", manifest_python=python)
    (root / "pre" / "1" / "model.py").write_text(source)
    refresh_manifest(root)
    report = check(root)
    if reason is None:
        assert report.problems == []
    else:
        [problem] = report.problems
        module = reason.split()[2]
        assert problem == Problem("pre/1/model.py", f"import {module}", f"the stub runs Python {python} (manifest.json "
                                                                         f"python_version), whose standard library "
                                                                         f"{reason}")


def test_check_parses_python_models_as_the_stub_python_when_it_is_known(tmp_path):
    """`except*` is Python 3.11: a 3.10 stub cannot import it, even where this interpreter parses it."""
    root = write_repo(tmp_path / "repo")
    (root / "pre" / "1" / "model.py").write_text("import numpy\ntry:\n    pass\nexcept* ValueError:\n    pass\n")
    refresh_manifest(root)
    [problem] = check(root, container="24.09").problems
    assert problem.file == "pre/1/model.py" and problem.reason.endswith(": Triton's python backend cannot import it")
    assert check(root, python="3.11").ok


def test_check_accepts_an_env_without_numpy_when_it_includes_the_system_site_packages(tmp_path):
    root = write_repo(tmp_path / "repo", env_python="3.11")
    fake_env(root / "pre" / "env.tar.gz", "3.11", numpy=None, system_site_packages=True)
    refresh_manifest(root)
    assert check(as_tarball(root)).problems == []


def test_check_cli_escapes_control_characters_when_a_member_name_holds_them(tmp_path, capsys, monkeypatch):
    """A hostile name cannot forge an output line: newline, carriage return, ESC and C1 controls are escapes."""
    import tritonpack.check

    forged = "x\n\r\x1b[2K\x85ok: repo is deployable"
    report = tritonpack.check.CheckReport("repo", problems=[Problem(forged, "f", "r")],
                                          warnings=[Problem(forged, "f", "r")], unchecked=[Problem(forged, "f", "r")])
    monkeypatch.setattr(tritonpack.check, "check", lambda *args, **kwargs: report)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "m").mkdir()
    (tmp_path / "repo" / "m" / "config.pbtxt").write_text("")
    assert main(["check", str(tmp_path / "repo")]) == 1
    captured = capsys.readouterr()
    escaped = "x\\x0a\\x0d\\x1b[2K\\x85ok: repo is deployable: f: r"
    assert captured.out.splitlines() == [escaped]
    assert captured.err.splitlines()[:2] == [f"warning: {escaped}", f"not checked: {escaped}"]
