"""Shared fixtures: built repositories (one build per session) and real tritonservers serving them."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Exports are content-addressed, so tests share the build cache with `make ensemble`.
BUILD_CACHE = Path(os.environ.get("TRITONPACK_TEST_CACHE", PROJECT_ROOT / "dist" / "cache"))


# Measured on a fresh clone (2026-11-26): temporary folders and the build cache grow by up to ~4.6 GB during a run.
RUN_NEEDS_GB = 5


def pytest_report_header(config):
    """Free space where the run writes (a full disk fails tests far from its cause, as ENOSPC in a stub)."""
    where = Path(tempfile.gettempdir())
    free_gb = shutil.disk_usage(where).free / 1e9
    warning = "" if free_gb >= RUN_NEEDS_GB else "; too little: tests writing tarballs may fail with ENOSPC"
    return f"temporary files: {where}, {free_gb:.1f} GB free (a whole run writes up to ~{RUN_NEEDS_GB} GB){warning}"


SHM = Path("/dev/shm")
_shm_first_seen: dict[str, str] = {}  # python-backend region → the test module after which it was first there


def _shm_regions() -> set[str]:
    from tritonpack.proc import SHM_PREFIX

    return {p.name for p in SHM.glob(f"{SHM_PREFIX}*")} if SHM.is_dir() else set()


@pytest.fixture(scope="module", autouse=True)
def _note_shm_regions(request):
    """Which module's servers leave python-backend regions behind (intermittent; reported, not failed)."""
    yield
    for region in _shm_regions() - _shm_first_seen.keys():
        _shm_first_seen[region] = request.module.__name__


def pytest_sessionstart(session):
    _shm_first_seen.update(dict.fromkeys(_shm_regions(), ""))  # there before the run: not its


def pytest_terminal_summary(terminalreporter):
    left = sorted(r for r in _shm_regions() if _shm_first_seen.get(r))
    if left:
        terminalreporter.write_line("/dev/shm regions left by this run: " + ", ".join(
            f"{r} (first there after {_shm_first_seen[r]})" for r in left))


@pytest.fixture(scope="session")
def test_dist(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    (dist / "cache").parent.mkdir(parents=True, exist_ok=True)
    BUILD_CACHE.mkdir(parents=True, exist_ok=True)
    (dist / "cache").symlink_to(BUILD_CACHE)
    return dist


@pytest.fixture(scope="session")
def artifact_cache(test_dist):
    """The build's artifact cache (shared with `make ensemble`): `artifact_cache.get(producer, **inputs)`."""
    from tritonpack.cache import ArtifactCache

    return ArtifactCache(test_dist / "cache")


@pytest.fixture(scope="session")
def model_folders(artifact_cache):
    """model_folders(name, target, **options) → {model name: ModelFolder}: a recipe rendered, no repository written."""
    from tritonpack import ensembles
    from tritonpack.assembly import assemble
    from tritonpack.builder import BuildRequest

    def _folders(name: str, target: str = "portable", **options):
        request = BuildRequest(name, target, **options)
        return {f.spec.name: f for f in assemble(ensembles.recipe(name), request, artifact_cache)}

    return _folders


@pytest.fixture
def python_model():
    """python_model(folder) → an initialized model straight from models/<source>/, with the fake pb_utils."""
    from tests.model_folders import fake_server

    with fake_server() as load_model:
        yield load_model


NEEDS_TENSORRT = {"bert", "resnet_trt"}  # their gpu target runs a TensorRT plan
FAKE_PLAN = b"not a TensorRT plan: TensorRT is not installed where this test runs\n"


@pytest.fixture(scope="session")
def given_plan(tmp_path_factory) -> Path:
    """A stand-in for a plan built elsewhere (`--plan`): TensorRT is not installable here, so its bytes are no
    engine; everything around it (configs, wiring, check) is real."""
    plan = tmp_path_factory.mktemp("plans") / "model.plan"
    plan.write_bytes(FAKE_PLAN)
    return plan


@pytest.fixture(scope="session")
def build_ensemble(test_dist):
    """build_ensemble(name, target, **options) → BuildResult, built once per session per arguments."""
    from tritonpack.builder import BuildRequest, build

    built = {}

    def _build(name: str, target: str = "portable", **options):
        # the local repository is what most tests serve; tarballs with packed environments are tested on purpose
        options.setdefault("env", False)
        # keyed by the request, so options spelled at their defaults (`plans=()`) share the default build
        request = BuildRequest(name, target, **options)
        if request not in built:
            dist = test_dist  # other options get a folder of their own: the same name and target share a path
            if request != BuildRequest(name, target, env=False):
                dist = test_dist / f"options-{len(built)}"
                dist.mkdir()
                (dist / "cache").symlink_to(test_dist / "cache")
            built[request] = build(replace(request, dist=dist))
        return built[request]

    return _build


@pytest.fixture(scope="session")
def served(build_ensemble):
    """served(name, target) → a ready TritonServer on that repository, one per session per repository."""
    from tritonpack.server import TritonServer

    servers = {}

    def _served(name: str, target: str = "portable"):
        if (name, target) not in servers:
            servers[(name, target)] = TritonServer(build_ensemble(name, target).repository).start()
        server = servers[(name, target)]
        assert server.is_ready(), f"server for {name}-{target} is not ready; log: {server.log_path}"
        return server

    yield _served
    for server in servers.values():
        server.stop()
