"""The local MME's disk cache and tarball sources, on real folders and a real boto3 client: one MME per cache folder,
and an S3 that does not answer turned into the gateway's one-line answers (the rest of the store is tested with the
model manager, tests/test_mme_manager.py)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from tritonpack.errors import UserError
from tritonpack.mme.local import LocalMME
from tritonpack.mme.sources import LocalSource, S3Source, TargetError
from tritonpack.mme.store import DiskCache, TargetStore


def test_disk_cache_refuses_a_second_user_of_its_folder_and_leaves_what_the_first_is_writing(tmp_path):
    """Two MMEs on one --cache-dir removed each other's downloads and extractions, and evicted each other's loaded
    targets."""
    first = DiskCache(tmp_path, max_bytes=1)
    download = first.staging_dir("a.tar.gz")
    with pytest.raises(UserError) as refused:
        DiskCache(tmp_path, max_bytes=0)
    assert str(refused.value) == (f"--cache-dir {tmp_path}: another local MME uses this disk cache; start this one "
                                  f"with another --cache-dir, or stop the other")
    assert download.is_dir()
    first.close()
    DiskCache(tmp_path, max_bytes=1).close()  # free again; and the download, now left by nobody, is removed
    assert not download.exists()


def test_local_mme_lets_another_use_its_disk_cache_once_stopped(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    first = LocalMME(str(models), port=0, cache_dir=tmp_path / "cache")
    first.stop()
    LocalMME(str(models), port=0, cache_dir=tmp_path / "cache").stop()


def test_target_store_inflates_the_environment_its_tarballs_share_once(tmp_path):
    """Every tarball the gateway admits is checked; those built with one environment carry its same bytes, which
    its check inflates for the first only (tests/test_check.py proves the report unchanged)."""
    from tests.test_check import as_tarball, fake_env, refresh_manifest, write_repo

    models = tmp_path / "models"
    models.mkdir()
    shared = as_tarball(write_repo(tmp_path / "shared", env_python="3.11"))
    for name in ("a.tar.gz", "b.tar.gz"):
        shutil.copy(shared, models / name)
    other = write_repo(tmp_path / "other", env_python="3.11")
    fake_env(other / "pre" / "env.tar.gz", "3.11", numpy="1.26.3")
    refresh_manifest(other)
    shutil.copy(as_tarball(other), models / "c.tar.gz")
    store = TargetStore(LocalSource(models), DiskCache(tmp_path / "cache", 1 << 30))
    for name in ("a.tar.gz", "b.tar.gz", "c.tar.gz"):
        assert (store.prepare(name, set).model_dir / "pre" / "env.tar.gz").is_file()
    assert store.known_envs.inspected == 2


def test_target_store_unpacks_in_its_check_and_leaves_nothing_of_a_tarball_it_refuses(tmp_path):
    """The check's one read writes a tarball's members into a staging folder: a refused tarball leaves nothing in
    the cache (its safe members were written before the unsafe one was read); an admitted one becomes the target's
    folder byte for byte, and a new version takes the old one's place."""
    import tarfile

    from tests.test_check import as_tarball, refresh_manifest, write_repo

    models = tmp_path / "models"
    models.mkdir()
    repo = write_repo(tmp_path / "repo", env_python="3.11")
    shutil.copy(as_tarball(repo), models / "a.tar.gz")
    with tarfile.open(models / "bad.tar.gz", "w:gz") as bad:
        bad.add(repo, arcname=".")
        bad.add(repo / "pre" / "1" / "model.py", arcname="pre/../../evil.py")
    cache = tmp_path / "cache"
    store = TargetStore(LocalSource(models), DiskCache(cache, 1 << 30))

    with pytest.raises(TargetError) as refused:
        store.prepare("bad.tar.gz", set)
    assert refused.value.status == 400
    assert "pre/../../evil.py: path: '..' leads outside the archive" in refused.value.problems
    assert list(cache.iterdir()) == [] and not (tmp_path / "evil.py").exists()

    def files(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    model_dir = store.prepare("a.tar.gz", set).model_dir
    assert files(model_dir) == files(repo)
    (repo / "pre" / "1" / "labels.txt").write_text("cat\n")
    refresh_manifest(repo)
    shutil.copy(as_tarball(repo), models / "a.tar.gz")
    assert store.prepare("a.tar.gz", set).model_dir == model_dir
    assert files(model_dir) == files(repo) and (model_dir / "pre" / "1" / "labels.txt").read_text() == "cat\n"
    assert [p.name for p in cache.iterdir()] == [model_dir.parent.name]  # no staging folder, no old version left


def test_target_store_unpacks_beside_a_download_named_as_its_unpacked_folder(tmp_path):
    """S3 downloads land in the staging folder under the target's name; a target named `model` collided with the
    folder the check unpacked into."""
    from tests.test_check import as_tarball, write_repo

    tarball = as_tarball(write_repo(tmp_path / "repo", env_python="3.11"))

    class Downloads(LocalSource):  # S3Source's way, without an S3: a copy under the target's own name
        def fetch(self, target: str, staging: Path) -> Path:
            return Path(shutil.copy(tarball, staging / target))

    store = TargetStore(Downloads(tmp_path), DiskCache(tmp_path / "cache", 1 << 30))
    shutil.copy(tarball, tmp_path / "model")
    assert (store.prepare("model", set).model_dir / "pre" / "1" / "model.py").is_file()


def s3_source(endpoint_url: str = "https://s3.us-east-1.amazonaws.com") -> S3Source:
    client = boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x", config=Config(retries={"max_attempts": 1}, connect_timeout=2))
    return S3Source("s3://bucket/models", client=client)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("code", "http_status", "status"), [
    ("SlowDown", 503, 503), ("InternalError", 500, 503), ("Throttling", 400, 503), ("InvalidBucketName", 400, 502)])
def test_s3_source_answers_503_with_retry_after_when_s3_is_busy_and_502_when_it_refuses(tmp_path, code, http_status,
                                                                                      status):
    """Anything but 403/404 from S3's HEAD went up as it was: the client got 500 InternalFailure and the log a
    traceback."""
    source = s3_source()
    with Stubber(source.client) as s3:
        s3.add_client_error("head_object", service_error_code=code, service_message="try later",
                            http_status_code=http_status)
        with pytest.raises(TargetError) as answered:
            TargetStore(source, DiskCache(tmp_path, 1)).prepare("a.tar.gz", set)
    error = answered.value
    assert error.status == status and (error.retry_after is not None) == (status == 503)
    assert "s3://bucket/models/a.tar.gz" in error.message and code in error.message and "\n" not in error.message


def test_s3_source_answers_502_naming_the_endpoint_when_it_is_down(tmp_path):
    source = s3_source(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(TargetError) as answered:
        source.version("a.tar.gz")
    assert answered.value.status == 502 and answered.value.code == "ServiceUnavailable"
    assert answered.value.message.startswith("could not fetch s3://bucket/models/a.tar.gz: Could not connect to the "
                                             "endpoint URL")
