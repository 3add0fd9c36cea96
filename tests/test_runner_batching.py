"""The portable framework runner groups ragged requests by length before padding (issue 5, fewer wasted tokens)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tritonpack.components import load_model_module


def _runner_module():
    return load_model_module("framework_runner", "runner_batching")


def test_length_groups_keeps_every_request_once_when_lengths_vary():
    groups = _runner_module().length_groups([(1, 5), (1, 60), (1, 6), (2, 58), (1, 7), (32, 20)])
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_length_groups_separates_short_from_long_when_padding_would_waste_tokens():
    groups = _runner_module().length_groups([(1, 5), (1, 60), (1, 6), (1, 58)], max_waste=0.25)
    assert sorted(sorted(g) for g in groups) == [[0, 2], [1, 3]]


def test_length_groups_pads_up_to_the_free_padding_tokens_whatever_their_share():
    module = _runner_module()
    shapes = [(1, 20), (1, 60)] * 16  # 1,280 real tokens; one group of 32 rows at 60 tokens pads 640
    assert len(module.length_groups(shapes, max_waste=0.25)) == 2
    assert len(module.length_groups(shapes, max_waste=0.25, free_padding=640)) == 1
    assert len(module.length_groups(shapes, max_waste=0.25, free_padding=639)) == 2
    one_long = [(1, 20)] * 31 + [(1, 256)]  # padding the short rows to 256 would cost 7,316 tokens
    assert sorted(len(g) for g in module.length_groups(one_long, max_waste=0.25,
                                                       free_padding=module.GPU_FREE_PADDING_TOKENS)) == [1, 31]


def test_runner_weighs_padding_against_a_call_when_its_session_runs_on_a_gpu():
    """No GPU here: the session is a stand-in that says it runs on one (`on_gpu`, as torchscript_session and
    onnxruntime_session say on CUDA); the real sessions' attribute is tested on this CPU below."""
    module = _runner_module()
    shapes = []

    def session(batch):
        shapes.append(batch["input_ids"].shape)
        return {"token_embeddings": batch["input_ids"][..., None].astype(np.float32)}

    class Runner(module.FrameworkRunnerModel):
        def open_session(self, path, params):
            return session

    lengths = [5, 40, 6, 38] * 8
    mask = np.array([[1] * n + [0] * (40 - n) for n in lengths])
    item = {"input_ids": np.arange(1, 1 + 40 * len(lengths)).reshape(len(lengths), 40) * mask, "attention_mask": mask}
    config = {"input": [{"name": n, "allow_ragged_batch": True} for n in item],
              "output": [{"name": "token_embeddings", "dims": [-1, 1]}],
              "parameters": {"artifact": {"string_value": "x"}}}
    args = {"model_config": json.dumps(config), "model_repository": "/nonexistent", "model_version": "1"}
    for on_gpu, parameters, calls in ((False, {}, 2), (True, {}, 1), (True, {"free_padding_tokens": "0"}, 2)):
        session.on_gpu = on_gpu
        config["parameters"].update({k: {"string_value": v} for k, v in parameters.items()})
        args["model_config"] = json.dumps(config)
        runner = Runner()
        runner.initialize(args)
        shapes.clear()
        (result,) = runner._run([item])
        runner.finalize()
        assert len(shapes) == calls, (on_gpu, parameters)
        np.testing.assert_array_equal(result["token_embeddings"][..., 0], item["input_ids"].astype(np.float32))


def test_torchscript_session_says_whether_it_runs_on_a_gpu(tmp_path):
    import torch

    session_module = load_model_module("framework_runner", "torchscript_session")
    torch.jit.trace(torch.nn.Linear(3, 2), torch.ones(1, 3)).save(str(tmp_path / "model.pt"))
    run = session_module.open_session(str(tmp_path / "model.pt"), {"input_order": "x", "output_order": "y"})
    assert run({"x": np.ones((4, 3), np.float32)})["y"].shape == (4, 2)
    assert run.on_gpu is torch.cuda.is_available()  # False on this machine, True where CUDA is


def test_length_groups_makes_one_group_when_lengths_are_equal():
    assert len(_runner_module().length_groups([(1, 12)] * 8)) == 1


def test_runner_outputs_equal_one_padded_call_when_requests_are_grouped():
    module = _runner_module()

    class EchoRunner(module.FrameworkRunnerModel):  # no attention mask: whole requests are grouped by length
        def __init__(self):
            self.input_names, self.output_names = ["input_ids"], ["token_embeddings"]
            self.ragged, self.trimmed_outputs, self.max_padding_waste = True, {"token_embeddings"}, 0.0
            self.shapes = []

        def session(self, batch):
            self.shapes.append(batch["input_ids"].shape)
            return {"token_embeddings": np.repeat(batch["input_ids"][..., None].astype(np.float32), 3, axis=2)}

    rng = np.random.default_rng(5)
    items = [{"input_ids": rng.integers(1, 100, size=(2, length))} for length in (3, 17, 4, 16)]
    runner = EchoRunner()
    results = runner._run(items)
    assert sorted(runner.shapes) == [(2, 3), (2, 4), (2, 16), (2, 17)]  # no padding allowed: one call per length
    for item, result in zip(items, results, strict=True):
        expected = np.repeat(item["input_ids"][..., None].astype(np.float32), 3, axis=2)
        np.testing.assert_array_equal(result["token_embeddings"], expected)

    runner.max_padding_waste, runner.shapes = 0.5, []
    results = runner._run(items)
    assert sorted(runner.shapes) == [(4, 4), (4, 17)]  # short requests padded together, long ones together
    for item, result in zip(items, results, strict=True):
        np.testing.assert_array_equal(result["token_embeddings"][..., 0], item["input_ids"].astype(np.float32))


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


def _packing_module():
    return load_model_module("framework_runner", "packing")


def test_pack_groups_keeps_order_and_budget_when_rows_vary():
    groups = _packing_module().pack_groups([10, 20, 30, 50, 5, 300, 7], max_tokens=60)
    assert groups == [[0, 1, 2], [3, 4], [5], [6]]  # a row over the budget runs alone


def test_packed_inputs_restart_positions_and_number_segments_when_rows_are_joined():
    packing = _packing_module()
    feeds = packing.packed_inputs([{"input_ids": np.array([101, 7, 102])}, {"input_ids": np.array([101, 102])}])
    np.testing.assert_array_equal(feeds["input_ids"], [[101, 7, 102, 101, 102]])
    np.testing.assert_array_equal(feeds["position_ids"], [[0, 1, 2, 0, 1]])
    np.testing.assert_array_equal(feeds["segment_ids"], [[0, 0, 0, 1, 1]])
    rows = packing.unpacked(np.arange(10).reshape(1, 5, 2), [3, 2])
    assert [r.tolist() for r in rows] == [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8, 9]]]


def test_packed_inputs_pad_to_the_multiple_with_a_segment_no_row_reads_when_asked():
    packing = _packing_module()
    feeds = packing.packed_inputs([{"input_ids": np.array([101, 7, 102])}, {"input_ids": np.array([101, 102])}], 8)
    np.testing.assert_array_equal(feeds["input_ids"], [[101, 7, 102, 101, 102, 0, 0, 0]])
    np.testing.assert_array_equal(feeds["position_ids"], [[0, 1, 2, 0, 1, 0, 1, 2]])
    np.testing.assert_array_equal(feeds["segment_ids"], [[0, 0, 0, 1, 1, 2, 2, 2]])
    rows = packing.unpacked(np.arange(8).reshape(1, 8, 1), [3, 2])
    assert [r[:, 0].tolist() for r in rows] == [[0, 1, 2], [3, 4]]  # the padding is not part of any row


class PackedEchoRunner:
    """A runner whose session is a packed encoder that answers, per token, (input id, position, segment)."""

    def __new__(cls, max_pack_tokens: int):
        module = _runner_module()

        class Runner(module.FrameworkRunnerModel):
            def __init__(self):
                self.input_names = ["input_ids", "attention_mask", "token_type_ids"]
                self.output_names = ["token_embeddings"]
                self.ragged, self.trimmed_outputs = True, {"token_embeddings"}
                self.max_pack_tokens, self.packs = max_pack_tokens, []

            def session(self, feeds):
                assert set(feeds) == {"input_ids", "token_type_ids", "position_ids", "segment_ids"}
                self.packs.append(feeds["input_ids"].shape[1])
                values = np.stack([feeds["input_ids"], feeds["position_ids"], feeds["segment_ids"]], axis=-1)
                return {"token_embeddings": values.astype(np.float32)}

        return Runner()


def test_packed_runner_gives_every_row_its_own_tokens_and_positions_when_requests_are_packed():
    runner = PackedEchoRunner(max_pack_tokens=16)
    items = []
    for lengths, width in (([3, 5], 6), ([9], 9), ([2, 4, 1], 5)):
        mask = np.array([[1] * n + [0] * (width - n) for n in lengths])
        ids = (np.arange(mask.size).reshape(mask.shape) + 100) * mask
        items.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    results = runner._run(items)
    assert runner.packs == [16, 16]  # [3, 5] and [9, 2, 4, 1]: ≤ 16 real tokens each, padded to a multiple of 16
    for item, result in zip(items, results, strict=True):
        tokens = result["token_embeddings"]
        assert tokens.shape == item["input_ids"].shape + (3,)
        for row, mask in enumerate(item["attention_mask"]):
            n = int(mask.sum())
            np.testing.assert_array_equal(tokens[row, :n, 0], item["input_ids"][row, :n])
            np.testing.assert_array_equal(tokens[row, :n, 1], np.arange(n))  # positions restart per sentence
            assert len(set(tokens[row, :n, 2])) == 1  # one segment per sentence
            assert not tokens[row, n:].any()  # padded positions are zero



def test_packed_runner_gives_row_outputs_in_request_order_when_the_encoder_pools():
    module = _runner_module()
    packing = _packing_module()

    class PoolingRunner(module.FrameworkRunnerModel):
        """A packed encoder that pools: one output row per sentence of the pack (its first token id)."""

        def __init__(self):
            self.input_names, self.output_names = ["input_ids", "attention_mask"], ["EMBEDDING"]
            self.ragged, self.trimmed_outputs, self.max_pack_tokens = True, set(), 8

        def session(self, feeds):
            rows = packing.unpacked(feeds["input_ids"][..., None], np.bincount(feeds["segment_ids"][0]).tolist())
            return {"EMBEDDING": np.array([[row[0, 0], len(row)] for row in rows], dtype=np.float32)}

    items = []
    for lengths, width in (([3, 5], 5), ([6], 7), ([2, 1, 4], 4)):
        mask = np.array([[1] * n + [0] * (width - n) for n in lengths])
        items.append({"input_ids": (np.arange(mask.size).reshape(mask.shape) + 100) * mask, "attention_mask": mask})
    results = PoolingRunner()._run(items)
    for item, result in zip(items, results, strict=True):
        expected = [[ids[0], mask.sum()] for ids, mask in zip(item["input_ids"], item["attention_mask"], strict=True)]
        np.testing.assert_array_equal(result["EMBEDDING"], expected)


def test_pack_groups_starts_a_new_pack_when_the_rows_reach_the_slot_limit():
    groups = _packing_module().pack_groups([2] * 10, max_tokens=256, max_rows=4)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # 20 tokens would fit one pack; 4 sentence slots do not


def test_pack_groups_splits_a_batch_into_similar_packs_when_spread_over_infer_requests():
    lengths = [20, 25, 18, 30, 22, 19, 24, 26]
    groups = _packing_module().pack_groups(lengths, max_tokens=256, spread=2)
    assert [i for g in groups for i in g] == list(range(8)) and len(groups) == 2
    sizes = [sum(lengths[i] for i in g) for g in groups]
    assert abs(sizes[0] - sizes[1]) <= max(lengths)  # one pack per request, each about half the tokens


def test_pack_groups_keeps_one_pack_per_row_when_there_are_fewer_rows_than_requests():
    assert _packing_module().pack_groups([40], max_tokens=256, spread=4) == [[0]]


class SlotEchoSession:
    """A pooled packed encoder with `slots` sentence slots, runnable several calls at once like OpenVINO's session:
    row i of the output is (first token id of segment i, its length), zeros for slots no sentence uses."""

    def __init__(self, slots: int, parallel: int):
        self.slots, self.parallel, self.calls, self.maps = slots, parallel, [], []

    def __call__(self, feeds):
        self.calls.append(feeds["input_ids"].shape[1])
        out = np.zeros((self.slots, 2), dtype=np.float32)
        segments, ids = feeds["segment_ids"][0], feeds["input_ids"][0]
        for s in range(self.slots):
            where = np.flatnonzero(segments == s)
            if len(where):
                out[s] = ids[where[0]], len(where)
        return {"EMBEDDING": out}

    def map(self, calls):
        self.maps.append(len(calls))
        return [self(feeds) for feeds in calls]


def _pooling_runner(session, max_pack_tokens: int, max_pack_rows: int):
    module = _runner_module()

    class Runner(module.FrameworkRunnerModel):
        def __init__(self):
            self.input_names, self.output_names = ["input_ids", "attention_mask"], ["EMBEDDING"]
            self.ragged, self.trimmed_outputs = True, set()
            self.max_pack_tokens, self.max_pack_rows, self.session = max_pack_tokens, max_pack_rows, session

    return Runner()


def _requests(rng, sizes, width=12):
    items = []
    for rows in sizes:
        lengths = rng.integers(2, width + 1, size=rows)
        mask = (np.arange(width) < lengths[:, None]).astype(np.int64)
        items.append({"input_ids": rng.integers(100, 30000, size=(rows, width)) * mask, "attention_mask": mask})
    return items


def test_packed_runner_answers_the_same_when_packs_run_on_several_infer_requests_at_once():
    rng = np.random.default_rng(3)
    items = _requests(rng, [1, 3, 1, 2, 5, 1])
    one_at_a_time, together = SlotEchoSession(8, parallel=1), SlotEchoSession(8, parallel=2)
    expected = _pooling_runner(one_at_a_time, 64, 8)._run(items)
    got = _pooling_runner(together, 64, 8)._run(items)
    assert together.maps and min(together.maps) >= 2  # the batch went out as packs for both requests at once
    for e, g, item in zip(expected, got, items, strict=True):
        np.testing.assert_array_equal(e["EMBEDDING"], g["EMBEDDING"])
        np.testing.assert_array_equal(g["EMBEDDING"][:, 1], item["attention_mask"].sum(1))  # each row its own


def test_packed_runner_fills_at_most_the_slots_when_a_batch_has_more_short_rows():
    session = SlotEchoSession(4, parallel=1)
    items = _requests(np.random.default_rng(4), [10], width=3)
    (result,) = _pooling_runner(session, 256, 4)._run(items)
    assert len(session.calls) == 3  # 10 sentences in packs of ≤ 4, though their tokens fit one pack
    np.testing.assert_array_equal(result["EMBEDDING"][:, 0], items[0]["input_ids"][:, 0])


def _loaded_and_warmed(session, tmp_path, parameters: dict[str, str]) -> None:
    """A packed pooling runner over `session`, initialised with these config parameters and its warming awaited."""
    module = _runner_module()

    class Runner(module.FrameworkRunnerModel):
        def open_session(self, path, params):
            return session

    config = {"input": [{"name": n, "dims": ["-1"], "allow_ragged_batch": True}
                        for n in ("input_ids", "attention_mask")],
              "output": [{"name": "EMBEDDING", "dims": ["2"]}],
              "parameters": {k: {"string_value": v} for k, v in {"artifact": "model.xml", **parameters}.items()}}
    runner = Runner()
    runner.initialize({"model_config": json.dumps(config), "model_repository": str(tmp_path), "model_version": "1"})
    runner.warming.join(timeout=30)
    runner.finalize()


def test_packed_runner_warms_every_pack_length_in_the_background_when_loaded(tmp_path):
    session = SlotEchoSession(4, parallel=1)
    _loaded_and_warmed(session, tmp_path, {"max_pack_tokens": "64", "max_pack_rows": "4"})
    assert sorted(session.calls) == [16, 32, 48, 64]  # every multiple of 16 up to the budget, once


class GuardedSlotEchoSession(SlotEchoSession):
    """A SlotEchoSession that, like OpenVINO's bf16-guarded session, is told how many of each pack's segments are
    sentences, and records (the pack's segments, that count, how many of its segments hold real ids)."""

    guarded = True

    def __init__(self, slots: int, parallel: int):
        super().__init__(slots, parallel)
        self.told = []

    def __call__(self, feeds, sentences=0):
        segments, ids = feeds["segment_ids"][0], feeds["input_ids"][0]
        self.told.append((int(segments.max()) + 1, sentences, len(np.unique(segments[ids > 0]))))  # padding: id 0
        return super().__call__(feeds)

    def map(self, calls, sentences=None):
        self.maps.append(len(calls))
        return [self(feeds, n) for feeds, n in zip(calls, sentences, strict=True)]


@pytest.mark.parametrize("parallel", [1, 2])
def test_packed_runner_tells_a_guarded_session_how_many_of_each_packs_segments_are_sentences(parallel):
    items = _requests(np.random.default_rng(5), [1, 4, 2, 1, 6, 3], width=40)
    plain, guarded = SlotEchoSession(64, parallel), GuardedSlotEchoSession(64, parallel)
    expected = _pooling_runner(plain, 256, 64)._run(items)
    got = _pooling_runner(guarded, 256, 64)._run(items)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(e["EMBEDDING"], g["EMBEDDING"])  # every row its own answer, in order
    assert len(plain.calls) == len(guarded.told)  # the same packs: guarding changes no packing
    assert any(segments > sentences for segments, sentences, _ in guarded.told)  # a pack with padding of its own
    for segments, sentences, real in guarded.told:
        assert sentences == real and segments in (sentences, sentences + 1)
