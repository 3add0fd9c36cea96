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
    ("bert", "portable", ("tokenizer", "encoder")),  # the packed encoder pools itself
    ("bert", "cpu", ("tokenizer", "encoder", "pooling")),
    ("bert_pt", "portable", ("tokenizer", "encoder", "pooling")),
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
    assert "token_embeddings" in field and "gives dims [-1, 384], needs [-1, 768]" in reason


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
