"""Tokenizer logic without a server: same ids as sentence-transformers, truncation, padding, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.texts import LONG, SENTENCES
from tritonpack.build.text_source import SentenceTransformerSource
from tritonpack.components import load_model_module

tokenize_text = load_model_module("tokenizer", "tokenize_text")
ClientError, TextTokenizer, decode_texts = tokenize_text.ClientError, tokenize_text.TextTokenizer, \
    tokenize_text.decode_texts


@pytest.fixture(scope="module")
def source():
    return SentenceTransformerSource.resolve(None)


@pytest.fixture(scope="module")
def tokenizer(source):
    return TextTokenizer(str(source.path / "tokenizer.json"), source.max_seq_length, source.pad_token,
                         with_token_type_ids=True)


@pytest.fixture(scope="module")
def reference(source):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(source.path), device="cpu")


def test_tokenizer_matches_sentence_transformers_when_batch_is_varied(tokenizer, reference):
    ours = tokenizer(SENTENCES)
    theirs = reference.tokenize(SENTENCES)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(ours[name], theirs[name].numpy(), err_msg=name)


def test_tokenizer_truncates_at_max_sequence_length_when_text_is_long(tokenizer, source):
    ids = tokenizer([LONG])["input_ids"]
    assert source.max_seq_length == 256
    assert ids.shape == (1, 256)
    assert ids[0, -1] == tokenizer.tokenizer.token_to_id("[SEP]")


def test_tokenizer_pads_to_longest_when_lengths_differ(tokenizer):
    out = tokenizer(["short", "a much longer sentence than the first one"])
    mask = out["attention_mask"]
    assert mask.shape[1] == mask[1].sum()  # longest has no padding
    assert mask[0].sum() == 3  # [CLS] short [SEP]
    assert (out["input_ids"][0, 3:] == 0).all()


def test_tokenizer_gives_cls_sep_when_text_is_empty(tokenizer):
    out = tokenizer([""])
    assert out["input_ids"].tolist() == [[101, 102]]
    assert out["attention_mask"].tolist() == [[1, 1]]


def test_per_request_trims_each_request_to_its_own_longest_when_batched(tokenizer):
    requests = [["tiny"], ["one longer sentence here", "x"], [""]]
    parts = tokenizer.per_request(requests)
    whole = tokenizer([t for r in requests for t in r])
    assert [p["input_ids"].shape for p in parts] == [(1, 3), (2, 6), (1, 2)]
    np.testing.assert_array_equal(parts[1]["input_ids"], whole["input_ids"][1:3, :6])


def test_decode_texts_rejects_request_when_bytes_are_not_utf8():
    with pytest.raises(ClientError, match="not valid UTF-8"):
        decode_texts(np.array([[b"ok"], [b"\xff\xfe"]], dtype=object), max_text_bytes=100)


def test_decode_texts_accepts_the_limits_and_refuses_one_past_each():
    assert decode_texts(np.array([[b"x" * 10]], dtype=object), max_text_bytes=10) == ["x" * 10]
    with pytest.raises(ClientError, match="TEXT element of 11 bytes exceeds the limit of 10"):
        decode_texts(np.array([[b"x" * 11]], dtype=object), max_text_bytes=10)
    assert decode_texts(np.array([[b"a"], [b"b"]], dtype=object), max_text_bytes=10, max_batch=2) == ["a", "b"]
    # Triton refuses more rows than max_batch_size first; the count is checked again before anything is decoded
    with pytest.raises(ClientError, match="TEXT has 3 elements, more than the limit of 2"):
        decode_texts(np.array([[b"a"], [b"b"], [b"\xff"]], dtype=object), max_text_bytes=10, max_batch=2)


def test_decode_texts_keeps_unicode_when_bytes_are_utf8():
    texts = ["Ünïcödé 🚀", "中文", ""]
    array = np.array([[t.encode()] for t in texts], dtype=object)
    assert decode_texts(array, max_text_bytes=100) == texts


def _long_texts() -> list[str]:
    import random

    rng = random.Random(7)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs,", "café", "naïve", "résumé", "東京",
             "don't", "3.14", "tokenizers"]
    prose = [" ".join(rng.choice(words) for _ in range(n)) for n in (900, 3000, 12000)]
    return prose + [
        "few words " + " " * 6000 + "then many more words " * 2000,  # the start holds too few tokens: whole text
        "東京都" * 8000,  # no space to cut at
        "a\u0000b\u200bc " * 4000,  # characters the normaliser drops
        "word " * 819 + "x" * 5000,  # one long word right after the cut
    ]


def test_tokenizer_gives_long_texts_the_tokens_of_the_whole_text_when_it_reads_only_their_start(tokenizer, source):
    from tokenizers import Tokenizer

    whole = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    whole.enable_truncation(max_length=source.max_seq_length)
    texts = _long_texts()
    expected = [e.ids for e in whole.encode_batch(texts)]
    for batch in (texts, texts[:3], texts[3:]):
        got = tokenizer(batch)
        mask = got["attention_mask"].astype(bool)
        got_ids = [row[m].tolist() for row, m in zip(got["input_ids"], mask, strict=True)]
        assert got_ids == [expected[texts.index(t)] for t in batch]


def test_tokenizer_reads_a_long_texts_start_only_when_that_fills_its_tokens(tokenizer, source, monkeypatch):
    seen: list[list[int]] = []
    encode_batch = tokenizer.tokenizer.encode_batch

    class Spy:
        def __getattr__(self, name):
            return getattr(encode_batch.__self__, name)

        def encode_batch(self, texts):
            seen.append([len(t) for t in texts])
            return encode_batch(texts)

    monkeypatch.setattr(tokenizer, "tokenizer", Spy())
    prose, few = _long_texts()[2], _long_texts()[3]
    tokenizer([prose])
    assert len(seen) == 1 and seen[0][0] <= source.max_seq_length * tokenize_text.START_CHARS_PER_TOKEN < len(prose)
    seen.clear()
    tokenizer([prose, few])
    assert len(seen) == 2 and seen[1][1] == len(few) and seen[1][0] < len(prose)
