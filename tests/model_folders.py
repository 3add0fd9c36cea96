"""Python-backend model code under test, straight from `models/<name>/`: pure logic modules
(`tritonpack.components.load_model_module`), and model.py adapters run with the fake pb_utils. Nothing they put on
sys.path or into sys.modules outlives the `with` block."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests import fake_pb_utils
from tritonpack.components import ModelFolder, model_imports


@contextmanager
def fake_server() -> Iterator:
    """`load_model(folder)` → an initialized TritonPythonModel from the folder's model.py (the file in models/),
    with the fake pb_utils; the folder's other files (artifacts, tokenizer.json) are linked into a temporary
    version folder."""
    import tempfile

    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="model-under-test-")))
        saved = sys.modules.get("triton_python_backend_utils")
        sys.modules["triton_python_backend_utils"] = fake_pb_utils.module()
        stack.callback(lambda: sys.modules.pop("triton_python_backend_utils") if saved is None
                       else sys.modules.__setitem__("triton_python_backend_utils", saved))

        def load_model(folder: ModelFolder):
            name = folder.spec.name
            link_files(folder, root / name)
            source = Path(folder.files["1/model.py"])
            stack.enter_context(model_imports(source.parent.name))
            spec = importlib.util.spec_from_file_location(f"model_{uuid.uuid4().hex}", source)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            model = module.TritonPythonModel()
            model.initialize({"model_config": config_json(folder), "model_repository": str(root / name),
                              "model_version": "1", "model_name": name})
            if hasattr(model, "finalize"):  # as Triton unloads it; a model's own threads stop
                stack.callback(model.finalize)
            return model

        yield load_model


def link_files(folder: ModelFolder, to: Path, sources: bool = False) -> None:
    """The folder's files linked under `to` as a model folder on disk (its Python sources too with `sources`)."""
    for relative, path in folder.files.items():
        if sources or not relative.endswith(".py"):
            (to / relative).parent.mkdir(parents=True, exist_ok=True)
            (to / relative).symlink_to(Path(path).resolve())


def config_json(folder: ModelFolder) -> str:
    """The folder's config as Triton hands it to a python model's `initialize` (`args["model_config"]`)."""
    from google.protobuf import json_format

    return json.dumps(json_format.MessageToDict(folder.spec.to_proto(), preserving_proto_field_name=True))
