"""The packed DALI environment (`envs/dali`, slimmed by `tritonpack.envpack.extra_strip`) runs the portable DALI runner.

The `resnet_pt` preprocessing model gets the env through `EXECUTION_ENV_PATH` exactly as a tarball build attaches
it, is served alone by the real tritonserver, and its PIXELS must equal an in-process run of the same `model.dali`
with `.venv`'s DALI; the stub must have loaded DALI's libraries from the unpacked env, not from `.venv`. Twice: the
env for this interpreter's Python on the local stub, and the env for the default container's Python on that Python's
stub (`containers.ContainerPython`), as the container runs it. Packing an env takes ~1.5 minutes on a fresh cache
(DALI's wheels are ~800 MB unpacked); both run in `make test`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.images import bad_payloads, image_kinds
from tritonpack.components import load_model_module
from tritonpack.containers import DEFAULT_CONTAINER, ContainerPython, container_python
from tritonpack.proc import mapped_files
from tritonpack.server import PYTHON_VERSION

MODEL = "resnet_pt_preprocess"


@pytest.fixture(scope="module", params=[PYTHON_VERSION, container_python(DEFAULT_CONTAINER)])
def env_repository(request, tmp_path_factory, model_folders, artifact_cache) -> tuple[Path, str]:
    """Only the DALI step of `resnet_pt` (portable), with the DALI env packed for a Python at the repository's top;
    (the repository, that Python)."""
    from tritonpack.env import attach_environment
    from tritonpack.repository import write_repository

    plan = attach_environment([model_folders("resnet_pt", "portable")[MODEL]], artifact_cache,
                              python=request.param)  # packed once per Python
    assert plan.environment["env"] == "dali" and plan.users == [MODEL]
    repository = write_repository(plan.folders, tmp_path_factory.mktemp("dali-env") / "repo",
                                  top_files=plan.top_files)
    return repository, request.param


def preprocess_in_process(model_dali: Path, image: bytes) -> np.ndarray:
    serialized_pipeline = load_model_module("dali_runner", "serialized_pipeline")
    pipeline = serialized_pipeline.SerializedPipeline.from_file(str(model_dali), input_name="IMAGE", max_batch_size=1)
    return pipeline.run([np.frombuffer(image, dtype=np.uint8)])[0]


@pytest.mark.server
def test_dali_runner_serves_same_pixels_from_packed_env_when_env_is_attached(env_repository):
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    from tritonpack.client import image_inputs
    from tritonpack.server import TritonServer
    from tritonpack.spec import parse_config

    env_repository, python = env_repository
    config = parse_config((env_repository / MODEL / "config.pbtxt").read_text())
    env_file = config.parameters["EXECUTION_ENV_PATH"].string_value.rsplit("/", 1)[1]
    assert (env_repository / env_file).is_file() and env_file.endswith(f"-py{python}.tar.gz")
    model_dali = env_repository / MODEL / "1" / "model.dali"
    stub = ContainerPython.find(python) if python != PYTHON_VERSION else None
    with TritonServer(env_repository, container_python=stub) as server:
        client = http.InferenceServerClient(server.url, network_timeout=120)
        try:
            for kind, image in image_kinds().items():
                answer = client.infer(MODEL, image_inputs([image]),
                                      outputs=[http.InferRequestedOutput("PIXELS", binary_data=True)])
                np.testing.assert_allclose(answer.as_numpy("PIXELS")[0], preprocess_in_process(model_dali, image),
                                           rtol=1e-6, atol=1e-6, err_msg=kind)
            with pytest.raises(InferenceServerException, match="IMAGE: not an image DALI decodes") as bad:
                client.infer(MODEL, image_inputs([bad_payloads()["truncated_jpeg"]]))
            assert bad.value.status() == "400"
            assert server.is_ready()
        finally:
            client.close()
        mapped = {path for pid in server.process_group_pids() for path in mapped_files(pid)}
    dali_libraries = {path for path in mapped if path.endswith("libdali_operators.so")}
    assert dali_libraries, "no process of the server loaded DALI"
    assert {Path(path).name for path in mapped if "/libpython3" in path} == {f"libpython{python}.so.1.0"}
    venv = Path(sys.prefix).resolve()
    assert not [p for p in dali_libraries if Path(p).is_relative_to(venv)], (
        f"the stub loaded DALI from .venv, not from the packed env: {dali_libraries}")


@pytest.mark.parametrize(("path", "stripped"), [
    ("nvidia/dali/backend_impl.cpython-312-x86_64-linux-gnu.so", True),
    ("nvidia/dali/python_function_plugin.cpython-314t-x86_64-linux-gnu.so", True),
    ("nvidia/nvimgcodec/nvimgcodec_impl.cpython-39-x86_64-linux-gnu.so", True),
    ("nvidia/nvimgcodec/extensions/libnvjpeg_ext.so.0.9.0", True),
    ("nvidia/nvimgcodec/extensions/libnvtiff_ext.so.0.9.0", True),
    ("nvidia/dali/backend_impl.cpython-311-x86_64-linux-gnu.so", False),
    ("numpy/core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so", False),
    ("nvidia/nvimgcodec/extensions/libjpeg_turbo_ext.so.0.9.0", False),
    ("nvidia/nvimgcodec/extensions/libopencv_ext.so.0.9.0", False),
    ("nvidia/dali/libdali_operators.so", False),
    ("nvidia/dali/.libs/libavcodec-0c04e3c0.so.63", False),
])
def test_dali_env_strip_keeps_only_what_the_cpu_runner_loads_when_packing_for_python_3_11(path, stripped):
    from tritonpack.envpack import extra_strip

    assert bool(extra_strip("dali", "3.11").search(path)) is stripped


def test_dali_strip_rules_apply_only_to_environments_with_dali_when_combined():
    from tritonpack.envpack import EnvSpec, extra_strip

    assert extra_strip("text", "3.11") is None and extra_strip("onnx", "3.10") is None
    assert EnvSpec.load(("onnx", "text")).extra_strip("3.10") is None
    combined = EnvSpec.load(("dali", "onnx")).extra_strip("3.10")
    assert combined.search("nvidia/dali/backend_impl.cpython-311-x86_64-linux-gnu.so")  # another CPython's module
    assert not combined.search("nvidia/dali/backend_impl.cpython-310-x86_64-linux-gnu.so")  # the env's own
