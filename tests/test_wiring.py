"""Ensemble wiring: each step's tensors exist in the composing configs with the same dtype and compatible dims."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tritonpack.spec import parse_config
from tritonpack.wiring import wiring_problems


@pytest.fixture(scope="module")
def bert_configs(build_ensemble):
    repository = build_ensemble("bert", "cpu").repository  # three steps: tokenizer, encoder, pooling
    return {p.parent.name: parse_config(p.read_text()) for p in repository.glob("*/config.pbtxt")}


def _copy(configs):
    return {name: type(cfg).FromString(cfg.SerializeToString()) for name, cfg in configs.items()}


@pytest.mark.parametrize(("name", "target", "steps"), [
    ("bert", "portable", ("encoder",)),  # the packed encoder reads the text and pools itself
    ("bert", "cpu", ("tokenizer", "encoder", "pooling")),
    ("bert_pt", "portable", ("tokenizer", "encoder")),  # its TorchScript pools in its graph
])
def test_wiring_has_no_problems_when_ensemble_is_built(name, target, steps, build_ensemble):
    repository = build_ensemble(name, target).repository
    configs = {p.parent.name: parse_config(p.read_text()) for p in repository.glob("*/config.pbtxt")}
    assert wiring_problems(configs[name], configs) == []
    assert [s.model_name for s in configs[name].ensemble_scheduling.step] == [f"{name}_{s}" for s in steps]


def test_wiring_reports_dtype_when_producer_and_consumer_disagree(bert_configs):
    configs = _copy(bert_configs)
    next(t for t in configs["bert_encoder"].input if t.name == "input_ids").data_type = mc.DataType.Value("TYPE_INT32")
    problems = wiring_problems(configs["bert"], configs)
    assert len(problems) == 1
    field, reason = problems[0]
    assert field == "ensemble_scheduling.step[1] (bert_encoder).input_map[input_ids]"
    assert "bert_tokenizer.input_ids gives TYPE_INT64" in reason


def test_wiring_reports_dims_when_hidden_size_differs(bert_configs):
    configs = _copy(bert_configs)
    pooled = next(t for t in configs["bert_pooling"].input if t.name == "token_embeddings")
    pooled.dims[1] = 768
    (field, reason), = wiring_problems(configs["bert"], configs)
    assert "token_embeddings" in field and "gives shape [-1, -1, 384], needs [-1, -1, 768]" in reason


def test_wiring_reports_missing_model_when_step_names_absent_folder(bert_configs):
    configs = _copy(bert_configs)
    del configs["bert_pooling"]
    problems = wiring_problems(configs["bert"], configs)
    assert ("ensemble_scheduling.step[2] (bert_pooling)", "model bert_pooling is not in the repository") in problems
    assert any(f == "output[EMBEDDING]" for f, _ in problems)


def test_wiring_reports_unknown_input_when_step_maps_misspelled_tensor(bert_configs):
    configs = _copy(bert_configs)
    step = configs["bert"].ensemble_scheduling.step[0]
    step.input_map["TEXTS"] = step.input_map.pop("TEXT")
    problems = wiring_problems(configs["bert"], configs)
    assert any("has no input TEXTS" in reason for _, reason in problems)
    assert any("inputs ['TEXT'] of bert_tokenizer are not mapped" in reason for _, reason in problems)


def test_wiring_reports_batching_when_step_batches_less_than_ensemble(bert_configs):
    configs = _copy(bert_configs)
    configs["bert_encoder"].max_batch_size = 8
    (field, reason), = wiring_problems(configs["bert"], configs)
    assert reason == "ensemble max_batch_size 64 exceeds bert_encoder's 8"


def test_wiring_accepts_a_step_that_does_not_batch_when_its_shapes_with_the_batch_dimension_agree(bert_configs):
    """Triton loads it (verified: a portable bert with its tokenizer at max_batch_size 0, TEXT [-1, 1], outputs
    [-1, -1]); the dims as declared differ, the full shapes do not."""
    configs = _copy(bert_configs)
    tokenizer = configs["bert_tokenizer"]
    tokenizer.max_batch_size = 0
    for tensor in (*tokenizer.input, *tokenizer.output):
        tensor.dims.insert(0, -1)
    assert wiring_problems(configs["bert"], configs) == []
    tokenizer.input[0].dims[:] = [1]  # without the batch dimension: [1] against the ensemble's [-1, 1]
    (field, reason), = wiring_problems(configs["bert"], configs)
    assert reason == "tensor TEXT: ensemble input gives shape [-1, 1], needs [1]"


def test_wiring_compares_the_reshaped_shape_of_an_ensemble_output_when_it_has_one(bert_configs):
    """Triton compares an ensemble tensor's `reshape` shape (verified: EMBEDDING dims [1, 384] reshaped to [384]
    loads; dims [384] reshaped to [1, 384] is refused)."""
    configs = _copy(bert_configs)
    output = configs["bert"].output[0]
    output.dims[:] = [1, 384]
    output.reshape.shape[:] = [384]
    assert wiring_problems(configs["bert"], configs) == []
    output.dims[:], output.reshape.shape[:] = [384], [1, 384]
    (field, reason), = wiring_problems(configs["bert"], configs)
    assert (field, reason) == ("output[EMBEDDING]", "bert_pooling.EMBEDDING gives TYPE_FP32 [-1, 384], ensemble "
                                                    "declares TYPE_FP32 [-1, 1, 384]")


def test_wiring_checks_pinned_step_versions_only_when_versions_are_given(bert_configs):
    configs = _copy(bert_configs)
    configs["bert"].ensemble_scheduling.step[1].model_version = 2
    assert wiring_problems(configs["bert"], configs) == []
    versions = {name: {1} for name in configs}
    (field, reason), = wiring_problems(configs["bert"], configs, versions)
    assert field == "ensemble_scheduling.step[1] (bert_encoder).model_version"
    versions["bert_encoder"] = {1, 2}
    assert wiring_problems(configs["bert"], configs, versions) == []
