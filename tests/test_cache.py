"""The artifact cache: produced once, keyed by everything the output depends on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonpack.cache import ArtifactCache, Producer

CALLS: list[dict] = []


def _write(out_dir: Path, source: Path, scale: int) -> None:
    CALLS.append({"source": source, "scale": scale})
    (out_dir / "out.txt").write_text(source.read_text() * scale)


def _producer(environment=None) -> Producer:
    return Producer("demo", _write, libraries=("numpy",), environment=environment)


@pytest.fixture
def cache(tmp_path) -> ArtifactCache:
    CALLS.clear()
    return ArtifactCache(tmp_path / "cache")


def test_cache_produces_once_when_inputs_repeat(cache, tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("ab")
    first = cache.get(_producer(), source=source, scale=2)
    again = cache.get(_producer(), source=source, scale=2)
    assert first == again and (first / "out.txt").read_text() == "abab"
    assert len(CALLS) == 1
    assert first.name.startswith("demo-") and not list(first.parent.glob(".demo-*"))  # no staging folder left


def test_cache_key_changes_when_file_content_or_setting_changes(cache, tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("ab")
    keys = {cache.key(_producer(), {"source": source, "scale": scale}) for scale in (2, 3)}
    source.write_text("abc")
    keys.add(cache.key(_producer(), {"source": source, "scale": 2}))
    assert len(keys) == 3


def test_cache_key_covers_machine_facts_when_producer_depends_on_them(cache, tmp_path):
    """A TensorRT plan is keyed by the TensorRT version and the GPU's compute capability: a plan built for one GPU
    or TensorRT release is never reused for another."""
    source = tmp_path / "source.txt"
    source.write_text("ab")
    machines = [{"tensorrt": trt, "compute_capability": cc} for trt in ("10.3", "10.7") for cc in ("8.0", "9.0")]
    keys = {cache.key(_producer(lambda m=m: m), {"source": source, "scale": 1}) for m in machines}
    assert len(keys) == 4


def test_tensorrt_plan_key_names_tensorrt_and_compute_capability_when_asked(cache, tmp_path, monkeypatch):
    """TensorRT and a GPU cannot run here: the module's probe of them is replaced by stand-ins (the test says so)."""
    import types

    import torch

    from tritonpack.build import build_tensorrt

    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx")
    inputs = {"onnx": onnx, "profiles": (), "fp16": False}
    keys = set()
    for version, capability in (("10.3.0", (8, 6)), ("10.3.0", (9, 0)), ("10.7.0", (9, 0))):
        monkeypatch.setattr(build_tensorrt, "require_tensorrt", lambda v=version: types.SimpleNamespace(__version__=v))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda c=capability: c)
        assert build_tensorrt.target_gpu() == {"tensorrt": version, "compute_capability": "{}.{}".format(*capability)}
        keys.add(cache.key(build_tensorrt.tensorrt_plan, inputs))
    assert len(keys) == 3  # a plan built for one GPU or TensorRT release is never reused for another


@pytest.mark.parametrize("error", [RuntimeError("export differs"), OSError(28, "No space left on device")])
def test_cache_leaves_nothing_when_producer_fails(cache, tmp_path, error):
    def fail(out_dir: Path) -> None:
        (out_dir / "half.txt").write_text("x")
        raise error

    with pytest.raises(type(error), match=str(error.args[-1])):
        cache.get(Producer("broken", fail))
    assert not list((tmp_path / "cache").iterdir())  # an OSError (a full disk) left its half-written folder
