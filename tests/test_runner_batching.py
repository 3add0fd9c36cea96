"""The portable framework runner groups ragged requests by length before padding (issue 5, fewer wasted tokens)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
RUNNER_DIR = MODELS_DIR / "framework_runner"


def _runner_module():
    sys.path.insert(0, str(MODELS_DIR / "shared"))
    try:
        spec = importlib.util.spec_from_file_location("runner_batching_under_test", RUNNER_DIR / "runner_batching.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(MODELS_DIR / "shared"))


def test_length_groups_keeps_every_request_once_when_lengths_vary():
    groups = _runner_module().length_groups([(1, 5), (1, 60), (1, 6), (2, 58), (1, 7), (32, 20)])
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_length_groups_separates_short_from_long_when_padding_would_waste_tokens():
    groups = _runner_module().length_groups([(1, 5), (1, 60), (1, 6), (1, 58)], max_waste=0.25)
    assert sorted(sorted(g) for g in groups) == [[0, 2], [1, 3]]


def test_length_groups_makes_one_group_when_lengths_are_equal():
    assert len(_runner_module().length_groups([(1, 12)] * 8)) == 1


def test_runner_outputs_equal_one_padded_call_when_requests_are_grouped():
    module = _runner_module()

    class EchoRunner(module.FrameworkRunnerModel):
        def __init__(self):
            self.input_names, self.output_names = ["input_ids", "attention_mask"], ["token_embeddings"]
            self.ragged, self.trimmed_outputs, self.max_padding_waste = True, {"token_embeddings"}, 0.0
            self.calls = 0

        def session(self, batch):
            self.calls += 1
            ids = batch["input_ids"].astype(np.float32)
            return {"token_embeddings": np.repeat(ids[..., None], 3, axis=2) * batch["attention_mask"][..., None]}

    rng = np.random.default_rng(5)
    items = []
    for length in (3, 17, 4, 16):
        ids = rng.integers(1, 100, size=(2, length))
        items.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    runner = EchoRunner()
    results = runner._run(items)
    assert runner.calls > 1
    for item, result in zip(items, results):
        expected = np.repeat(item["input_ids"][..., None].astype(np.float32), 3, axis=2)
        np.testing.assert_array_equal(result["token_embeddings"], expected)


def test_runner_groups_rows_by_real_length_when_one_request_mixes_short_and_long_rows():
    module = _runner_module()

    class EchoRunner(module.FrameworkRunnerModel):
        def __init__(self):
            self.input_names, self.output_names = ["input_ids", "attention_mask"], ["token_embeddings"]
            self.ragged, self.trimmed_outputs, self.max_padding_waste = True, {"token_embeddings"}, 0.25
            self.shapes = []

        def session(self, batch):
            self.shapes.append(batch["input_ids"].shape)
            return {"token_embeddings": (batch["input_ids"] * batch["attention_mask"]).astype(np.float32)[..., None]}

    lengths = [3, 40, 4, 38, 3]
    mask = np.array([[1] * n + [0] * (40 - n) for n in lengths])
    ids = np.arange(1, 201).reshape(5, 40) * mask
    runner = EchoRunner()
    (result,) = runner._run([{"input_ids": ids, "attention_mask": mask}])
    assert sorted(runner.shapes) == [(2, 40), (3, 4)]  # no row of 3 tokens padded to 40
    np.testing.assert_array_equal(result["token_embeddings"][..., 0], ids.astype(np.float32))
