"""Packed environments: which model needs which, reproducible packing, and a real server really using one."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest

from tritonpack import envpack
from tritonpack.archive import ArchiveLimits
from tritonpack.check import check, inspect_env
from tritonpack.components import Artifact, ModelFolder, StepSettings, framework_model, python_model
from tritonpack.containers import DEFAULT_CONTAINER, container_python, containers_for
from tritonpack.env import environment_for, envs_covering, required_modules
from tritonpack.envpack import (
    SHARED_OBJECT,
    EnvSpec,
    compile_bytecode,
    extra_strip,
    known_envs,
    local_python,
    pack_env,
    pack_prefix,
    site_packages,
    with_bytecode,
)
from tritonpack.errors import EnvError
from tritonpack.library_sharing import INDEX, MODULE, PTH_LINE, STORE, share_libraries
from tritonpack.spec import DynamicBatching, ModelSpec, Tensor

PROBE_MODULE = "tritonpack_env_probe"  # exists only inside the packed env built below
TEXT_ENV_LIMIT = 50_000_000


def runner(framework: str, tmp_path: Path):
    artifact = tmp_path / "model.bin"
    artifact.write_bytes(b"")
    return framework_model("enc", Artifact(framework, artifact), "portable", (Tensor("X", "TYPE_FP32", (-1,)),),
                           (Tensor("Y", "TYPE_FP32", (-1,)),), StepSettings(4, DynamicBatching()))


def python_spec(name: str) -> ModelSpec:
    return ModelSpec(name, backend="python", max_batch_size=4, inputs=(Tensor("X", "TYPE_FP32", (-1,)),),
                     outputs=(Tensor("Y", "TYPE_FP32", (-1,)),))


def test_environment_for_picks_smallest_env_when_model_imports_beyond_numpy(tmp_path):
    assert environment_for(python_model(python_spec("tok"), "tokenizer")) == (("text",), set())
    assert environment_for(python_model(python_spec("pool"), "mean_pooling")) == ((), set())
    assert environment_for(runner("onnx", tmp_path)) == (("onnx",), set())
    assert environment_for(runner("openvino_ir", tmp_path)) == (("openvino",), set())
    assert environment_for(runner("torchscript", tmp_path)) == ((), {"torch"})


def test_envs_covering_packs_several_envs_together_when_no_single_one_has_every_import():
    assert envs_covering({"tokenizers", "onnxruntime"}) == (("onnx", "text"), set())
    assert envs_covering({"tokenizers", "torch"}) == (("text",), {"torch"})


def test_required_modules_ignore_stdlib_and_siblings_when_reading_sources():
    # an import inside a function counts: `initialize` and `execute` run as surely as the module's body
    sources = {"model.py": "import json\nimport numpy as np\nimport helper\ntry:\n    import tokenizers\n"
                           "except ImportError:\n    pass\n\ndef f():\n    import torch\n",
               "helper.py": "import os\n"}
    assert required_modules(sources, {}) == {"tokenizers", "torch"}
    assert required_modules({}, {"framework": "onnxruntime"}) == {"onnxruntime"}
    with pytest.raises(SyntaxError) as error:
        required_modules({"helper.py": "import os\n", "model.py": "def f(:\n"}, {})
    assert (error.value.filename, error.value.lineno) == ("model.py", 1)


def test_container_python_follows_release_notes_when_looking_up_a_release():
    assert [container_python(v) for v in ("21.03", "23.02", "23.05", "24.10", "24.12", "25.08")] == \
        ["3.8", "3.8", "3.10", "3.10", "3.12", "3.12"]
    assert containers_for("3.10") == ["23.03-24.11"]
    assert containers_for("3.11") == []


def test_environments_take_numpy_from_the_container_only_where_every_container_of_their_python_has_numpy_1():
    from tritonpack.containers import takes_container_numpy

    assert [takes_container_numpy(p) for p in ("3.8", "3.10", "3.11", "3.12")] == [True, True, False, False]
    text = EnvSpec.load("text")
    assert text.installed("venv-pack", "3.10") == ("tokenizers==0.23.3",)
    assert text.installed("venv-pack", "3.12") == text.installed("venv-pack", "3.11") == text.packages
    assert text.installed("conda-pack", "3.10") == text.packages


def test_env_specs_pin_every_package_when_loaded():
    assert {"text", "onnx", "openvino", "dali"} <= set(known_envs())
    text = EnvSpec.load("text")
    assert text.packages == ("numpy==1.26.4", "tokenizers==0.23.3")
    assert text.python == "3.10"  # Triton 24.10 (the bundled server's release) runs Python 3.10


@pytest.mark.parametrize(("text", "reason"), [
    ("dependencies:\n  - python\n  - pip:\n      - numpy==1.26.4\n", "needs dependencies with a python=X.Y pin"),
    ("", "needs dependencies with a python=X.Y pin"),  # was an AttributeError
    ("dependencies: [python=3.10\n", "not YAML"),  # was a yaml.parser.ParserError
    ("dependencies:\n  - python=3.10\n  - pythonnet=3.0\n  - pip:\n      - numpy==1.26.4\n", None),
])
def test_env_spec_says_in_one_line_what_is_wrong_when_an_environment_file_is_malformed(tmp_path, monkeypatch, text,
                                                                                        reason):
    from tritonpack import envpack

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "environment.yml").write_text(text)
    monkeypatch.setattr(envpack, "ENVS_DIR", tmp_path)
    if reason is None:  # pythonnet is not a second Python pin
        assert EnvSpec.load("mine").python == "3.10"
        return
    with pytest.raises(EnvError, match=reason):
        EnvSpec.load("mine")


def test_pack_env_gives_same_bytes_when_packed_twice(tmp_path):
    python = container_python(DEFAULT_CONTAINER)  # what a build packs for
    first = pack_env("text", tmp_path / "a", python, method="venv-pack")
    second = pack_env("text", tmp_path / "b", python, method="venv-pack")
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.path.stat().st_size < TEXT_ENV_LIMIT
    with open(first.path, "rb") as f:
        info = inspect_env(f, first.path.name, ArchiveLimits())
    assert info.python == first.python and info.problems == []
    # numpy is the container Python's (the stock numpy every environment pins), imported from its site-packages
    assert info.distributions == {"tokenizers": "0.23.3"} and info.system_site_packages
    assert first.packages == ("tokenizers==0.23.3",)
    with tarfile.open(first.path) as tar:
        names = tar.getnames()
        cfg = tar.extractfile("pyvenv.cfg").read().decode()
    assert names == sorted(names) and len(names) == len(set(names))
    assert not [n for n in names if "/tests/" in n or n.startswith("lib64/")]
    assert "command" not in cfg and str(tmp_path) not in cfg
    # the bytes must not depend on which patch level packed them: the version is the target's X.Y only
    assert re.findall(r"^version\S* = (.*)$", cfg, re.MULTILINE) in ([first.python], [first.python] * 2), cfg
    assert_bytecode_in_place_of_every_module(first.path, first.python, tmp_path)
    assert_library_index_lists_every_shared_object(first.path, first.python)
    meta = json.loads(first.path.with_suffix("").with_suffix(".json").read_text())
    assert meta["compressed_bytes"] == first.path.stat().st_size



def test_an_environment_rewritten_for_a_tarball_is_the_same_tar_in_stored_gzip_blocks(tmp_path):
    tar = b"lib/python3.10/site-packages/openvino " * 40_000  # 1.5 MB that deflate shrinks ~100-fold
    packed = tmp_path / "packed.tar.gz"
    packed.write_bytes(gzip.compress(tar, compresslevel=9))
    stored = [tmp_path / f"stored{i}.tar.gz" for i in range(2)]
    for target in stored:
        envpack.rewrite_as_stored_gzip(packed, target)
    data = stored[0].read_bytes()
    assert gzip.decompress(data) == tar and data == stored[1].read_bytes()  # reproducible: no timestamp
    assert len(tar) < len(data) < len(tar) * 1.001  # stored: nothing left for Triton to inflate
    assert not list(tmp_path.glob("*.partial"))

# Python 3.10 (container 24.09's) writes a frozenset constant in its strings' hash order, random per process
FROZENSET_MODULE = 'def known(x):\n    return x in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"}\n'
HASH_ORDERED_PYTHON = "3.10"


def test_packing_without_a_local_python_of_the_containers_version_says_the_three_ways_out(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(Path, "home", lambda: tmp_path)  # no pyenv versions there
    with pytest.raises(EnvError) as refused:
        local_python("3.9")
    said = str(refused.value)
    assert said.startswith("venv-pack needs a local python3.9 to build a Python 3.9 env: install it")
    assert "`pyenv install 3.9`" in said and "use conda" in said and "--no-env; make: NO_ENV=1" in said


def pyc_bytes_of_two_compiles(tmp_path: Path, monkeypatch, compile_module) -> list:
    """`compile_module(folder, source) -> pyc path` run twice, each in a fresh interpreter: the two .pyc files' bytes.
    Without a local Python 3.10, what the compile was given instead, and what it must be: the string hash seed."""
    source = tmp_path / "known.py"
    source.write_text(FROZENSET_MODULE)
    try:
        local_python(HASH_ORDERED_PYTHON)
    except EnvError:
        seeds = []
        monkeypatch.setattr(envpack, "local_python", lambda python: sys.executable)
        monkeypatch.setattr(envpack, "_run", lambda cmd, **options: seeds.append(
            options.get("env", os.environ).get("PYTHONHASHSEED")))
        compile_module(tmp_path, source)
        return [seeds, ["0"]]
    return [compile_module(tmp_path / run, source).read_bytes() for run in ("a", "b")]


def test_compile_bytecode_gives_the_same_pyc_bytes_when_a_set_of_strings_is_compiled_twice(tmp_path, monkeypatch):
    def compile_in_env(folder: Path, source: Path) -> Path:
        prefix = folder / "env"
        site = site_packages(prefix, HASH_ORDERED_PYTHON)
        site.mkdir(parents=True)
        (prefix / "bin").mkdir()
        (prefix / "bin" / "python").symlink_to(envpack.local_python(HASH_ORDERED_PYTHON))
        shutil.copyfile(source, site / "known.py")
        compile_bytecode(prefix, HASH_ORDERED_PYTHON)
        return site / "known.pyc"

    first, second = pyc_bytes_of_two_compiles(tmp_path, monkeypatch, compile_in_env)
    assert first == second


def test_with_bytecode_gives_the_same_pyc_bytes_when_a_set_of_strings_is_compiled_twice(tmp_path, monkeypatch):
    def compile_model(folder: Path, source: Path) -> Path:
        [compiled] = with_bytecode([ModelFolder(python_spec("known"), {"1/known.py": source})], HASH_ORDERED_PYTHON,
                                   folder / "bytecode")
        return next(path for name, path in compiled.files.items() if name.endswith(".pyc"))

    first, second = pyc_bytes_of_two_compiles(tmp_path, monkeypatch, compile_model)
    assert first == second


def assert_bytecode_in_place_of_every_module(env: Path, python: str, tmp_path: Path) -> None:
    """site-packages holds bytecode and no Python source: hash-based, unchecked (flags 0b01 after the magic), naming
    no build path; the env's own Python imports tokenizers from it."""
    site_prefix = f"lib/python{python}/site-packages/"
    with tarfile.open(env) as tar:
        names = [n for n in tar.getnames() if n.startswith(site_prefix)]
        bytecode = [n for n in names if n.endswith(".pyc")]
        assert len(bytecode) > 10 and not [n for n in names if n.endswith(".py")]
        for name in bytecode:
            data = tar.extractfile(name).read()
            assert data[4:8] == (1).to_bytes(4, "little") and str(tmp_path).encode() not in data, name
        tar.extractall(tmp_path / "unpacked", filter="tar")
    site = tmp_path / "unpacked" / site_prefix
    verbose = subprocess.run([local_python(python), "-B", "-v", "-c", "import tokenizers.implementations"],
                             env={"PYTHONPATH": str(site)}, capture_output=True, text=True, check=True).stderr
    loaded = [line for line in verbose.splitlines()
              if line.startswith("# code object from") and str(site / "tokenizers") in line]
    assert len(loaded) > 8 and all(line.rstrip("'").endswith(".pyc") for line in loaded), verbose[-2000:]


def assert_library_index_lists_every_shared_object(env: Path, python: str) -> None:
    """The sharing hook is installed (module, `.pth` line) and its index names every shared object of the env,
    tokenizers' included, with the SHA-256 of the bytes packed."""
    site_prefix = f"lib/python{python}/site-packages/"
    with tarfile.open(env) as tar:
        index = json.loads(tar.extractfile(site_prefix + INDEX).read())
        assert tar.extractfile(f"{site_prefix}{MODULE}.pth").read().decode() == PTH_LINE
        assert f"{site_prefix}{MODULE}.pyc" in tar.getnames()
        shared_objects = {m.name: hashlib.sha256(tar.extractfile(m).read()).hexdigest() for m in tar.getmembers()
                          if m.isfile() and SHARED_OBJECT.search(m.name)}
    assert index == shared_objects
    assert any("/tokenizers/tokenizers." in name for name in index)


def unpacked_env(root: Path, files: dict[str, bytes]) -> tuple[Path, dict[str, str]]:
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    return root, {relative: hashlib.sha256(data).hexdigest() for relative, data in files.items()}


def test_library_sharing_links_equal_libraries_of_environments_triton_unpacked_to_one_copy(tmp_path):
    files = {"lib/libbig.so.2": b"\x7fELF big library" * 1000, "lib/python3.10/site-packages/m/_ext.so": b"ext"}
    first, index = unpacked_env(tmp_path / "python_env_AbC123" / "0", files)
    second, _ = unpacked_env(tmp_path / "python_env_AbC123" / "1", files)
    (second / "lib" / "unindexed.so").write_bytes(b"not in the index")

    assert share_libraries(first, index) == 0  # the first environment lends its files
    assert share_libraries(second, index) == sum(len(data) for data in files.values())
    for relative, data in files.items():
        assert os.path.samefile(first / relative, second / relative)
        assert (second / relative).read_bytes() == data
    assert share_libraries(second, index) == 0  # shared already
    assert sorted(p.name for p in (tmp_path / "python_env_AbC123" / STORE).iterdir()) == sorted(index.values())
    assert (tmp_path / "python_env_AbC123" / STORE).stat().st_mode & 0o777 == 0o700
    assert not [p for p in second.rglob(".*")]  # no temporary link left behind


def test_library_sharing_leaves_no_temporary_link_when_another_stub_shared_the_file_meanwhile(tmp_path, monkeypatch):
    """Two stubs of one environment: the other links the file to the stored copy between this one's check and its
    rename, which then does nothing (both names are one file) and left `.<lib>.<pid>.shared` behind."""
    files = {"lib/libbig.so.2": b"\x7fELF big library" * 100}
    first, index = unpacked_env(tmp_path / "python_env_AbC123" / "0", files)
    second, _ = unpacked_env(tmp_path / "python_env_AbC123" / "1", files)
    share_libraries(first, index)
    share_libraries(second, index)  # what the other stub did
    monkeypatch.setattr(os.path, "samefile", lambda a, b: False)  # this stub checked before it did
    share_libraries(second, index)
    assert not [p for p in second.rglob(".*")]
    assert (second / "lib" / "libbig.so.2").read_bytes() == files["lib/libbig.so.2"]


def test_library_sharing_keeps_its_own_file_when_the_stored_one_differs_or_triton_did_not_unpack_it(tmp_path):
    first, index = unpacked_env(tmp_path / "python_env_x" / "0", {"lib/a.so": b"one size"})
    second, _ = unpacked_env(tmp_path / "python_env_x" / "1", {"lib/a.so": b"another size"})
    share_libraries(first, index)
    assert share_libraries(second, index) == 0
    assert (second / "lib" / "a.so").read_bytes() == b"another size"

    elsewhere, index = unpacked_env(tmp_path / "venvs" / "0", {"lib/a.so": b"one size"})
    assert share_libraries(elsewhere, index) == 0
    assert sorted(p.name for p in (tmp_path / "venvs").iterdir()) == ["0"]


@pytest.fixture(scope="module")
def probe_repository(tmp_path_factory) -> Path:
    """A python model importing a module that only its packed env has, served through EXECUTION_ENV_PATH."""
    work = tmp_path_factory.mktemp("probe")
    prefix = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install", "--quiet",
                    "--no-deps", "--no-compile", "numpy==1.26.4"], check=True, capture_output=True)
    site = next(prefix.glob("lib/python*/site-packages"))
    (site / f"{PROBE_MODULE}.py").write_text("FACTOR = 7.0\n")
    repo = work / "repo"
    (repo / "probe" / "1").mkdir(parents=True)
    env_file = "probe-env.tar.gz"
    pack_prefix(prefix, repo / "probe" / env_file, f"{sys.version_info.major}.{sys.version_info.minor}")
    spec = ModelSpec("probe", backend="python", max_batch_size=0, inputs=(Tensor("X", "TYPE_FP32", (3,)),),
                     outputs=(Tensor("Y", "TYPE_FP32", (3,)),),
                     parameters={"EXECUTION_ENV_PATH": f"$$TRITON_MODEL_DIRECTORY/{env_file}"})
    (repo / "probe" / "config.pbtxt").write_text(spec.render())
    (repo / "probe" / "1" / "model.py").write_text(f'''
import numpy as np
import triton_python_backend_utils as pb_utils
import {PROBE_MODULE}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = (x * {PROBE_MODULE}.FACTOR).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
''')
    return repo


def test_probe_module_is_absent_when_imported_outside_the_packed_env():
    result = subprocess.run([sys.executable, "-c", f"import {PROBE_MODULE}"], capture_output=True)
    assert result.returncode != 0


def test_check_passes_when_probe_env_matches_local_python(probe_repository):
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    report = check(probe_repository, python=python)
    assert report.ok, report.problems


@pytest.mark.server
def test_server_uses_packed_env_when_model_imports_module_only_the_env_has(probe_repository):
    from tritonpack.server import TritonServer

    with TritonServer(probe_repository) as server:
        body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]})
        request = urllib.request.Request(f"http://{server.url}/v2/models/probe/infer", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    assert answer["outputs"][0]["data"] == [7.0, 14.0, 21.0]  # FACTOR came from the packed env


@pytest.mark.parametrize(("path", "stripped"), [
    ("openvino/libs/libopenvino_intel_gpu_plugin.so", True),
    ("openvino/libs/libopenvino_intel_npu_plugin.so", True),
    ("openvino/libs/libopenvino_auto_plugin.so", True),
    ("openvino/libs/libopenvino_auto_batch_plugin.so", True),
    ("openvino/libs/libopenvino_hetero_plugin.so", True),
    ("openvino/libs/libopenvino_c.so.2641", True),
    ("openvino/libs/cache.json", True),
    ("openvino/libs/libopenvino_onnx_frontend.so.2641", True),
    ("openvino/libs/libopenvino_pytorch_frontend.so.2641", True),
    ("openvino/libs/libopenvino_tensorflow_lite_frontend.so.2641", True),
    ("openvino/tools/ovc/main.py", True),
    ("openvino/cmake/OpenVINOConfig.cmake", True),
    ("openvino/frontend/onnx/__init__.py", True),
    ("openvino/frontend/pytorch/fx_decoder.py", True),
    ("openvino/libs/libopenvino_intel_cpu_plugin.so", False),
    ("openvino/libs/libopenvino_ir_frontend.so.2641", False),
    ("openvino/libs/libopenvino.so.2641", False),
    ("openvino/libs/libtbb.so.12", False),
    ("openvino/frontend/__init__.py", False),
    ("openvino/frontend/frontend.py", False),
])
def test_openvino_env_strip_keeps_cpu_plugin_and_ir_reader_when_packing(path, stripped):
    assert bool(extra_strip("openvino", "3.11").search(path)) is stripped


def test_with_bytecode_compiles_into_the_folder_named_when_paths_are_relative(tmp_path, monkeypatch):
    """The compiler runs inside `into`: relative paths named folders within it (`make bench` builds in dist/…)."""
    monkeypatch.chdir(tmp_path)
    Path("known.py").write_text("KNOWN = 1\n")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    [compiled] = with_bytecode([ModelFolder(python_spec("known"), {"1/known.py": Path("known.py")})], python,
                               Path("staging") / "bytecode")
    [pyc] = [path for name, path in compiled.files.items() if name.endswith(".pyc")]
    tag = python.replace(".", "")
    assert pyc == tmp_path / "staging" / "bytecode" / "known" / "1" / "__pycache__" / f"known.cpython-{tag}.pyc"
    assert pyc.is_file()
