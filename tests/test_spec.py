"""Config rendering: specs validate early, render through Triton's protobuf, parse back, match golden files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import text_format

from tests.conftest import NEEDS_TENSORRT
from tritonpack import ensembles
from tritonpack.builder import BuildRequest
from tritonpack.spec import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelSpec,
    ModelWarmup,
    SpecError,
    Tensor,
    WarmupInput,
    parse_config,
)

GOLDEN = Path(__file__).parent / "golden"
# Regenerate after an intended change with: UPDATE_GOLDEN=1 make test
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _encoder(**overrides) -> ModelSpec:
    fields = dict(name="enc", platform="onnxruntime_onnx", max_batch_size=8,
                  inputs=(Tensor("x", "TYPE_INT64", (-1,)),), outputs=(Tensor("y", "TYPE_FP32", (-1, 4)),))
    return ModelSpec(**{**fields, **overrides})


def test_render_round_trips_through_protobuf_when_every_field_is_set():
    spec = _encoder(
        instance_group=(InstanceGroup("KIND_GPU", 2),),
        dynamic_batching=DynamicBatching((4, 8), 100),
        parameters={"EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"},
        model_warmup=(ModelWarmup("b8", 8, (WarmupInput("x", "TYPE_INT64", (16,)),)),),
    )
    parsed = parse_config(spec.render())
    assert parsed == spec.to_proto()
    assert parsed.parameters["EXECUTION_ENV_PATH"].string_value == "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4, 8]
    assert parsed.model_warmup[0].inputs["x"].random_data


def test_render_writes_max_batch_size_zero_when_model_is_not_batched():
    text = _encoder(max_batch_size=0).render()
    assert "max_batch_size: 0" in text
    assert parse_config(text).max_batch_size == 0


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(inputs=(Tensor("x", "TYPE_INT64", (-1,)), Tensor("x", "TYPE_INT64", (1,)))), "duplicate tensor names"),
    (dict(backend="python"), "exactly one of backend or platform"),
    (dict(max_batch_size=0, dynamic_batching=DynamicBatching()), "needs max_batch_size > 0"),
    (dict(ensemble_steps=(EnsembleStep("m", {"a": "a"}, {"b": "b"}),)), "only an ensemble"),
    (dict(labelled_output="nope"), "labelled_output nope is not an output"),
    (dict(name="a/b"), "not a valid folder name"),
])
def test_model_spec_rejects_config_when_triton_would(overrides, message):
    with pytest.raises(SpecError, match=message):
        _encoder(**overrides)


def test_ensemble_spec_rejects_dynamic_batching_when_set_on_the_ensemble():
    with pytest.raises(SpecError, match="belong to its steps"):
        ModelSpec(name="e", platform="ensemble", max_batch_size=8, inputs=(Tensor("a", "TYPE_FP32", (1,)),),
                  outputs=(Tensor("b", "TYPE_FP32", (1,)),), dynamic_batching=DynamicBatching(),
                  ensemble_steps=(EnsembleStep("m", {"a": "a"}, {"b": "b"}),))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(data_type="TYPE_FLOAT"), "unknown data_type"),
    (dict(dims=(0,)), "dims must be positive or -1"),
    (dict(name=""), "name is empty"),
])
def test_tensor_rejects_field_when_invalid(kwargs, message):
    with pytest.raises(SpecError, match=message):
        Tensor(**{"name": "t", "data_type": "TYPE_FP32", "dims": (1,), **kwargs})


def test_parse_config_names_line_when_field_is_misspelled():
    with pytest.raises(text_format.ParseError, match="2:1 .*max_batch_sizes"):
        parse_config('name: "x"\nmax_batch_sizes: 4\n')


def _recipe_targets():
    for name in ensembles.NAMES:
        for target in ensembles.recipe(name).targets:
            yield name, target


@pytest.mark.parametrize(("name", "target"), list(_recipe_targets()))
def test_rendered_configs_equal_golden_files_when_built(name, target, build_ensemble, given_plan):
    # a gpu TensorRT step needs a plan built on a GPU: here it is given (a stand-in file), as users give theirs
    plans = (("", str(given_plan)),) if target == "gpu" and name in NEEDS_TENSORRT else ()
    repository = build_ensemble(name, target, plans=plans).repository
    golden_dir = GOLDEN / f"{name}-{target}"
    rendered = {p.parent.name: p.read_text() for p in sorted(repository.glob("*/config.pbtxt"))}
    if UPDATE:
        golden_dir.mkdir(parents=True, exist_ok=True)
        for old in golden_dir.glob("*.pbtxt"):
            old.unlink()
        for model, text in rendered.items():
            (golden_dir / f"{model}.pbtxt").write_text(text)
    golden = {p.stem: p.read_text() for p in sorted(golden_dir.glob("*.pbtxt"))}
    assert golden, f"no golden files in {golden_dir}; run UPDATE_GOLDEN=1 make test"
    assert rendered == golden
    for text in rendered.values():
        assert parse_config(text).name


def test_every_recipe_target_has_golden_files_when_built():
    missing = [f"{n}-{t}" for n, t in _recipe_targets() if not (GOLDEN / f"{n}-{t}").is_dir()]
    assert not missing, f"no golden configs for {missing}"


def test_build_request_rejects_target_when_recipe_lacks_it():
    with pytest.raises(SpecError, match="unknown target"):
        BuildRequest("bert", "tpu")
    with pytest.raises(SpecError, match="unknown ensemble"):
        BuildRequest("gpt", "cpu")


def test_pooling_step_batches_with_its_own_short_delay_while_the_encoder_waits_longer():
    from tritonpack.ensembles.text import TextServing

    serving = TextServing()
    assert serving.batching().max_queue_delay_microseconds == 2000
    assert serving.pooling_batching() == DynamicBatching(max_queue_delay_microseconds=100)
    assert serving.with_overrides((("pooling_queue_delay_microseconds", "0"),)).pooling_batching() == DynamicBatching()
    assert serving.with_overrides((("dynamic_batching", "false"),)).pooling_batching() is None
    with pytest.raises(SpecError, match="pooling_queue_delay_microseconds and preferred_batch_size cannot be negative"):
        TextServing(pooling_queue_delay_microseconds=-1)
