"""`tritonpack check --deep`: each native model's artifact against its config, as its Triton backend checks it.

For every model that is neither python nor an ensemble, each version folder's artifact is opened with its
framework's own Python library (imported only here, only when needed) and compared with the config as the backend
does at load time, then run once on the CPU with inputs shaped from the config (`*_rules.py`, one module per
backend; docs/backends.md says where each rule comes from). A tarball's artifacts are extracted into a temporary
folder, removed afterwards; a folder is read in place and nothing is written into it.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

from tritonpack.archive import ArchiveLimits
from tritonpack.backends import LOADED_FILES
from tritonpack.check.deep.model import DeepModel, Findings, TrialInputUnavailable
from tritonpack.check.tree import extract_members, is_version_folder

# platform or backend → "module:function" of its rules
RULES = {
    "onnxruntime_onnx": "onnxruntime_rules:check_onnxruntime",
    "onnxruntime": "onnxruntime_rules:check_onnxruntime",
    "pytorch_libtorch": "pytorch_rules:check_pytorch",
    "pytorch": "pytorch_rules:check_pytorch",
    "tensorflow_graphdef": "tensorflow_rules:check_graphdef",
    "tensorrt_plan": "tensorrt_rules:check_plan",
    "tensorrt": "tensorrt_rules:check_plan",
    "dali": "dali_rules:check_dali",
    "openvino": "openvino_rules:check_openvino",
}
NOT_NATIVE = frozenset({"python", "ensemble"})


def _kind(config) -> str:
    return config.platform or config.backend


def deep_check(path: Path, configs: dict, limits: ArchiveLimits) -> Findings:
    """Findings for every native model of the folder or tarball `path`, whose configs `check` parsed."""
    total = Findings(str(path), "")
    native = {folder: cfg for folder, cfg in configs.items() if _kind(cfg) and _kind(cfg) not in NOT_NATIVE}
    if not native:
        return total
    if Path(path).is_dir():
        _check_models(Path(path), native, total)
        return total
    with tempfile.TemporaryDirectory(prefix="tritonpack-deep-") as tmp:
        def in_native_version(name: str) -> bool:
            parts = name.split("/")
            return len(parts) > 2 and parts[0] in native and is_version_folder(parts[1])

        total.problems += extract_members(Path(path), Path(tmp), in_native_version, limits)
        if not total.problems:
            _check_models(Path(tmp), native, total)
    return total


def artifacts(version_dir: Path, config) -> list[Path]:
    """The files the backend loads from a version folder: the default (or `default_model_filename`); for DALI the
    serialized pipeline, else `dali.py` (its precedence); for TensorRT also each `cc_model_filenames` plan."""
    kind = _kind(config)
    default = config.default_model_filename or LOADED_FILES.get(kind, ("",))[0]
    if kind == "dali":
        return [p for p in (version_dir / default, version_dir / "dali.py") if p.exists()][:1]
    names = [default] + sorted(set(config.cc_model_filenames.values()) - {default})
    return [version_dir / n for n in names if n and (version_dir / n).exists()]


def _check_models(root: Path, native: dict, total: Findings) -> None:
    for folder, config in sorted(native.items()):
        model_dir = root / folder
        if not model_dir.is_dir():
            continue
        for version in sorted((p.name for p in model_dir.iterdir() if p.is_dir() and is_version_folder(p.name)),
                              key=int):
            for artifact in artifacts(model_dir / version, config):
                model = DeepModel(folder, version, artifact, config)
                findings = Findings(model.label, _kind(config))
                _apply_rules(model, findings)
                total.extend(findings)


def _apply_rules(model: DeepModel, out: Findings) -> None:
    rule = RULES.get(out.backend)
    if rule is None:
        out.not_checked(out.backend, f"--deep has no rules for {out.backend!r}")
        return
    module, function = rule.split(":")
    try:
        getattr(importlib.import_module(f"{__name__}.{module}"), function)(model, out)
    except ImportError as e:  # a framework this machine lacks: the check cannot run, the model may be fine
        out.not_checked(out.backend, f"{e.name or e} is not installed here, so the artifact was not opened")
    except TrialInputUnavailable as e:
        out.not_checked("run", str(e))
