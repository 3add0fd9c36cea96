"""MME tarballs: byte-for-byte reproducible, with a manifest free of times and paths, and packed envs that serve."""

from __future__ import annotations

import hashlib
import json
import re
import tarfile

import numpy as np
import pytest

from tests.conftest import BUILD_CACHE, ENV_CACHE
from tritonpack.builder import BuildRequest, build
from tritonpack.check import check

MANIFEST_KEYS = {"ensemble", "target", "sagemaker_triton_default_model_name", "build", "python_version",
                 "supported_containers", "environments", "sha256"}


def fresh_dist(tmp_path_factory, name):
    dist = tmp_path_factory.mktemp(name)
    (dist / "cache").symlink_to(BUILD_CACHE)
    ENV_CACHE.mkdir(parents=True, exist_ok=True)
    (dist / "envs").symlink_to(ENV_CACHE)
    return dist


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def env_builds(tmp_path_factory):
    """bert portable with packed envs, built twice into two different folders."""
    return [build(BuildRequest("bert", "portable", env=True, dist=fresh_dist(tmp_path_factory, f"d{i}")))
            for i in range(2)]


def test_tarball_has_same_bytes_when_built_twice_in_different_folders(env_builds, build_ensemble,
                                                                      tmp_path_factory):
    first, second = env_builds
    assert sha256(first.tarball) == sha256(second.tarball)
    plain = build_ensemble("bert")
    again = build(BuildRequest("bert", "portable", dist=fresh_dist(tmp_path_factory, "plain")))
    assert sha256(plain.tarball) == sha256(again.tarball)


def test_tarball_entries_are_sorted_and_normalised_when_written(env_builds):
    with tarfile.open(env_builds[0].tarball) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert env_builds[0].tarball.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header without a timestamp


def test_manifest_holds_no_time_or_path_when_written(env_builds):
    first = env_builds[0]
    text = (first.repository / "manifest.json").read_text()
    manifest = json.loads(text)
    assert set(manifest) >= MANIFEST_KEYS
    assert str(first.repository.parent) not in text and "/tmp" not in text and "/root" not in text
    assert not re.search(r"20\d\d-\d\d-\d\d|\d\d:\d\d:\d\d", text)
    assert manifest["sagemaker_triton_default_model_name"] == "bert"
    assert manifest["python_version"] == "3.11" and manifest["supported_containers"] == []
    for name, digest in manifest["sha256"].items():
        assert sha256(first.repository / name) == digest
    files = {p.relative_to(first.repository).as_posix() for p in first.repository.rglob("*") if p.is_file()}
    assert set(manifest["sha256"]) == files - {"manifest.json"}


def test_env_build_gives_env_only_to_models_needing_more_than_numpy_when_env_is_set(env_builds):
    repo = env_builds[0].repository
    manifest = json.loads((repo / "manifest.json").read_text())
    assert {m: e["env"] for m, e in manifest["environments"].items()} == {"bert_tokenizer": "text",
                                                                         "bert_encoder": "openvino"}
    tokenizer = (repo / "bert_tokenizer" / "config.pbtxt").read_text()
    assert 'string_value: "$$TRITON_MODEL_DIRECTORY/text-py3.11.tar.gz"' in tokenizer
    assert (repo / "bert_tokenizer" / "text-py3.11.tar.gz").stat().st_size < 50_000_000
    assert "EXECUTION_ENV_PATH" not in (repo / "bert" / "config.pbtxt").read_text()


def test_check_passes_when_env_tarball_targets_local_python(env_builds):
    report = check(env_builds[0].tarball)
    assert report.ok and report.warnings == [], report.problems + report.warnings
    mismatch = check(env_builds[0].tarball, container="24.10")
    assert {p.file for p in mismatch.problems} == {"bert_tokenizer/text-py3.11.tar.gz",
                                                   "bert_encoder/openvino-py3.11.tar.gz"}


@pytest.mark.server
def test_env_build_serves_same_embeddings_when_envs_are_packed(env_builds, served):
    from tritonpack.client import embed
    from tritonpack.server import TritonServer

    texts = ["packed environments", "a second sentence"]
    expected = embed(served("bert").url, "bert", texts)
    with TritonServer(env_builds[0].repository) as server:
        got = embed(server.url, "bert", texts)
    np.testing.assert_allclose(got, expected, atol=1e-5)
