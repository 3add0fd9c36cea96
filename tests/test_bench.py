"""The benchmarks package (`make bench`): its corpus, its arithmetic, its peer worker, and a smoke run that produces
the report with the expected keys. No number is ever checked against a target here."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from benchmarks import corpus, meters, peers
from benchmarks.meters import Run
from benchmarks.run import Bench, BenchSettings
from benchmarks.sides import PeerWorker, SentenceTransformersSide
from tritonpack.components import load_model_module
from tritonpack.containers import DEFAULT_CONTAINER, container_python


def test_corpus_is_deterministic_and_fills_every_length_bucket_when_generated():
    sentences = corpus.corpus(200, seed=5)
    assert sentences == corpus.corpus(200, seed=5)
    assert all(s.tokens == corpus.count_tokens(s.text) <= corpus.MAX_TOKENS for s in sentences)
    groups = corpus.by_bucket(sentences)
    assert list(groups) == [b.name for b in corpus.BUCKETS] and min(len(g) for g in groups.values()) >= 15
    assert max(s.tokens for s in sentences) > 200 and len({s.text for s in sentences}) > 150


def test_held_out_sentences_follow_the_corpus_mix_and_none_is_timed_canned_or_a_build_check_text():
    from tritonpack.build.export_text_encoder import CHECK_TEXTS

    for timed_count, count in ((512, 512), (48, 16)):  # the full bench's and the smoke run's
        timed = corpus.corpus(timed_count, seed=5)
        held = corpus.held_out(count, seed=5, timed=timed)
        assert held == corpus.held_out(count, seed=5, timed=timed)
        within = count - count // 8
        mix = {b.name: round(within * share) for b, share in zip(corpus.BUCKETS, corpus.MIX, strict=True)}
        assert {name: len(group) for name, group in corpus.by_bucket(held).items()} == \
            {**mix, corpus.TRUNCATED.name: count // 8}  # short ones were 88 of 448 when skipping thinned them
        texts = {s.text for s in held}
        assert len(texts) == count and all(s.tokens == corpus.count_tokens(s.text) for s in held)
        assert not texts & ({s.text for s in timed} | set(corpus._SHORT) | set(CHECK_TEXTS))  # "Thanks!" was one


def test_vocabulary_texts_read_every_whole_word_row_of_the_embedding_table_within_256_tokens():
    texts = corpus.vocabulary_texts()
    tokenizer = corpus._tokenizer()
    assert all(corpus.count_tokens(text) <= corpus.MAX_TOKENS for text in texts)
    whole_words = {i for word, i in tokenizer.get_vocab().items()
                   if not word.startswith(("##", "[")) and tokenizer.encode(word, add_special_tokens=False).ids == [i]}
    read = set().union(*(tokenizer.encode(text).ids for text in texts))
    assert whole_words <= read and len(whole_words) > 0.75 * tokenizer.get_vocab_size()
    words_per_text = corpus.MAX_TOKENS - 2  # [CLS] and [SEP]
    assert len(texts) == -(-len(whole_words) // words_per_text) and texts == corpus.vocabulary_texts()


def test_ratio_summary_reports_the_median_of_paired_runs_when_alternated():
    fast = [Run(100, 1.0, cpu_seconds=1.0), Run(100, 2.0, cpu_seconds=2.0), Run(100, 1.0)]
    slow = [Run(100, 2.0, cpu_seconds=2.0), Run(100, 2.0, cpu_seconds=2.0), Run(100, 3.0)]
    summary = meters.ratio_summary(fast, slow, target=1.5)
    assert summary["ratios"] == [2.0, 1.0, 3.0] and summary["median"] == 2.0 and summary["met"] is True
    assert summary["per_cpu_second_median"] == 1.5  # the run without CPU time is left out


def test_report_shows_each_ratio_with_the_range_of_its_repetitions_when_there_were_several():
    from benchmarks import report

    ratio = meters.ratio_summary([Run(90, 1.0), Run(77, 1.0), Run(93, 1.0)], [Run(100, 1.0)] * 3, 1.0)
    row, = report.summary_rows({"dynamic_batching": {"ratio": ratio}})
    assert report.row_value(row) == "0.90× (0.77–0.93)" and row["range"] == [0.77, 0.93]
    once = meters.ratio_summary([Run(90, 1.0)], [Run(100, 1.0)])
    single, = report.summary_rows({"dynamic_batching": {"ratio": once}})
    assert report.row_value(single) == "0.90×"
    assert "| 0.90× (0.77–0.93) |" in report.render_markdown({
        "mode": "smoke", "started": "", "machine": {"cpu_model": "x", "cores": 2, "cpu_flags": {}, "memory_gb": 1,
                                                    "platform": "", "python": ""},
        "summary": [row], "versions": {}, "settings": {}})


def test_side_summary_reports_per_cpu_second_only_over_runs_that_measured_cpu_time():
    measured = meters.side_summary([Run(100, 1.0, [5.0], cpu_seconds=2.0), Run(100, 2.0, [7.0]),
                                    Run(100, 1.0, [6.0], cpu_seconds=1.0)])
    assert measured["throughput_median"] == 100 and measured["per_cpu_second_median"] == 75
    assert meters.side_summary([Run(100, 1.0, [5.0])])["per_cpu_second_median"] is None  # not 0: not measured


def test_alternate_reverses_the_order_every_other_repetition_when_given_three_sides():
    order = []
    tasks = {name: (lambda name=name: order.append(name) or Run(1, 1.0)) for name in "ABC"}
    runs = meters.alternate(tasks, 3, log=lambda line: None)
    assert "".join(order) == "ABCCBAABC" and all(len(r) == 3 and r[0].cpu_seconds is not None for r in runs.values())


def test_machine_records_cpu_model_and_flags_when_read_from_proc():
    cpuinfo = Path("/proc/cpuinfo").read_text()  # read here on its own, not through the code under test
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE).group(1).strip()
    flags = set(re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.MULTILINE).group(1).split())
    record = meters.machine()
    assert record["cpu_model"] == model != "unknown" and record["cores"] == os.cpu_count() >= 1
    assert record["cpu_flags"] == {flag: flag in flags for flag in meters.CPU_FLAGS}
    assert {"avx2", "amx_bf16", "avx512_bf16", "avx512_fp16", "amx_fp16"} <= set(meters.CPU_FLAGS)
    family, number = (re.search(rf"^{key}\s*:\s*(\S+)", cpuinfo, re.MULTILINE).group(1)
                      for key in ("cpu family", "model"))
    assert record["cpu_family_model_stepping"].startswith(f"{family}/{number}/")


def test_cpu_throughput_measures_the_machines_matrix_and_interpreter_rates_on_torchs_threads():
    import torch

    rates = meters.cpu_throughput(seconds=0.05)
    assert rates["threads"] == torch.get_num_threads() >= 1
    assert set(rates) == {"threads", "f32_matmul_gflops", "bf16_matmul_gflops", "python_loop_million_per_s"}
    assert all(rate > 0 for key, rate in rates.items() if key != "threads")


def test_report_names_the_machines_rates_at_start_and_end_when_the_run_measured_them():
    from benchmarks import report

    base = {"mode": "full", "started": "", "summary": [], "versions": {}, "settings": {},
            "machine": {"cpu_model": "x", "cores": 2, "cpu_flags": {}, "memory_gb": 1, "platform": "", "python": ""}}
    probe = {"cpu_throughput_at_start": {"threads": 2, "f32_matmul_gflops": 312.4, "bf16_matmul_gflops": 1010.2,
                                         "python_loop_million_per_s": 40.2},
             "cpu_throughput_at_end": {"threads": 2, "f32_matmul_gflops": 201.0, "bf16_matmul_gflops": 640.0,
                                       "python_loop_million_per_s": 39.6}}
    rendered = report.render_markdown(base | probe)
    assert ("product on 2 threads; runs compare across hours only as far as these agree): f32 312 → 201, bf16 1010 "
            "→ 640 GFLOP/s, a Python loop 40 → 40 M additions/s.") in rendered
    assert "rates at the start" not in report.render_markdown(base)  # reports from before the probe render as before


def test_peer_env_is_ready_only_when_its_stamp_names_the_same_requirements(tmp_path):
    env = peers.PeerEnv("example", ("pkg==1.0",))
    assert not env.ready(tmp_path)
    env.folder(tmp_path).mkdir()
    (env.folder(tmp_path) / ".installed").write_text(env.stamp)
    assert env.ready(tmp_path)
    assert not peers.PeerEnv("example", ("pkg==2.0",)).ready(tmp_path)
    assert not peers.PeerEnv("example", ("pkg==1.0",), swaps=(("pkg", "pkg-fast==1.0"),)).ready(tmp_path)


def test_every_infinity_engine_the_full_bench_tries_is_defined_and_its_onnx_variants_share_one_export():
    engines = [peers.INFINITY_ENGINES[name] for name in BenchSettings().infinity_engines]
    assert {engine.env for engine in engines} == {peers.INFINITY, peers.INFINITY_OPENVINO}
    assert [engine.name for engine in engines if engine.reads_onnx] == ["optimum", "optimum-openvino"]
    assert peers.INFINITY_OPENVINO.requirements == peers.INFINITY.requirements  # only the ONNX Runtime build differs


def test_peer_worker_embeds_and_times_and_reuses_its_export_when_loaded_twice(tmp_path):
    export = tmp_path / "export"
    first = PeerWorker(sys.executable, "torch", corpus.model_path(), export, ".venv", tmp_path / "worker.log")
    try:
        side = SentenceTransformersSide(first, 64)
        texts = ["a short one", "a second, somewhat longer sentence about batching"]
        vectors = side.embed(texts)
        assert vectors.shape == (2, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        run = side.variant(32, torch_threads=1).run(texts * 8)
        assert run.items == 16 and run.seconds > 0
        assert first.info["loaded_from"] == str(corpus.model_path()) and (export / "modules.json").is_file()
        with pytest.raises(RuntimeError, match="unknown op"):
            first.ask({"op": "nonsense"})
    finally:
        side.close()
    assert first.process.poll() == 0
    second = PeerWorker(sys.executable, "torch", corpus.model_path(), export, ".venv", tmp_path / "worker.log")
    try:
        assert second.info["loaded_from"] == str(export)
        np.testing.assert_allclose(SentenceTransformersSide(second, 64).embed(texts), vectors, atol=1e-6)
    finally:
        second.close()


@pytest.mark.server
def test_bench_smoke_writes_report_files_with_expected_keys_when_run(test_dist, tmp_path):
    settings = BenchSettings.for_mode("smoke", out=tmp_path / "bench", dist=test_dist)
    report = Bench(settings, log=lambda line: None).run()

    out = tmp_path / "bench"
    assert (out / "report.md").read_text().startswith("# tritonpack bench report")
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(report["summary"]))
    for key in ("machine", "versions", "settings", "corpus", "load", "peers", "served_over_same_encoder", "mme",
                "sizes", "summary", "plots", "cpu_throughput_at_start", "cpu_throughput_at_end"):
        assert on_disk.get(key), key
        assert not isinstance(on_disk[key], dict) or on_disk[key].get("available", True), on_disk[key]
    assert {"cpu_model", "cores", "cpu_flags"} <= set(on_disk["machine"])
    peer = on_disk["peers"]
    assert {"st_torch_b64", "tritonpack"} <= set(peer["sides"])
    assert set(peer["skipped"]) == {"st-openvino", "infinity"}  # smoke mode installs no peer
    for c in settings.concurrencies:
        served, ratio = peer["by_concurrency"][f"tritonpack c={c}"], peer["ratios_by_concurrency"][str(c)]
        assert {"latency_p50_ms", "latency_p99_ms", "throughput_median"} <= set(served)
        assert {"median", "ratios", "per_cpu_second_median"} <= set(ratio["st_torch_b64"])
    assert set(peer["by_bucket"]) <= {b.name for b in corpus.BUCKETS}
    assert peer["cosine_to_st_torch"]["tritonpack"]["min"] > 0
    assert peer["cosine_to_st_torch"]["tritonpack"]["beyond_256_tokens"] is not None
    memory = on_disk["mme"]["memory"]
    assert set(memory["steps"]) == {"1", "2"} and memory["per_additional_model_pss_mb"] is not None
    assert all(step["pss_mb"] < step["rss_mb"] for step in memory["steps"].values())  # shared pages counted once
    # each step measures before and after every whole word of the vocabulary was embedded by each copy it loaded
    # (how much that reads of the embedding table depends on the CPU: bf16 compute holds its own copy)
    assert memory["vocabulary_words"] > 20000
    assert all(0 < step["before_vocabulary_pss_mb"] <= step["pss_mb"] + 5 for step in memory["steps"].values()), memory
    # idle, the models have unmapped the library pages their calls mapped (resident_memory.ReleasedWhenIdle)
    assert memory["idle_wait_s"] > load_model_module("tokenizer", "resident_memory").PAGES_IDLE_S
    assert all(step["pss_mb"] < step["recently_served_pss_mb"] - 5 for step in memory["steps"].values()), memory
    # the second copy's check hashed the packed environment it shares with the first instead of inflating it again
    assert memory["environments_inflated"] == 1 and set(memory["check_s_by_target"]) == {"bert-portable-copy2.tar.gz"}
    assert on_disk["mme"]["cold_start"]["first_answer_s_median"] > 0
    for run in on_disk["mme"]["cold_start"]["runs"]:  # the gateway's part and Triton's, both within the first answer
        assert min(run["gateway_s"], run["check_s"], run["extract_s"], run["triton_load_s"]) > 0, run
        assert run["fetch_s"] + run["check_s"] + run["extract_s"] <= run["gateway_s"], run
        assert run["gateway_s"] + run["triton_load_s"] < run["first_answer_s"], run
    assert on_disk["mme"]["cold_start"]["stock_endpoint"]["first_answer_s_median"] > 0
    # the default tarball as users upload it: its environment for the container's Python, run by that Python's stub
    assert on_disk["mme"]["stub_python"] == container_python(DEFAULT_CONTAINER) and on_disk["mme"]["container_python"]
    assert "ran each copy's packed environment" in (out / "report.md").read_text()
    environment = on_disk["mme"]["container_environment"]
    assert environment["SAGEMAKER_TRITON_ADDITIONAL_ARGS"] == "--disable-auto-complete-config"
    assert on_disk["sizes"]["tarball_mb"] > 0
    assert on_disk["plots"] and all((out / name).stat().st_size > 0 for name in on_disk["plots"])


def test_serving_overrides_turn_dynamic_batching_off_when_given_as_strings():
    from tritonpack.ensembles.text import TextServing
    from tritonpack.spec import SpecError

    serving = TextServing().with_overrides((("dynamic_batching", "false"), ("encoder_instances", "2"),
                                            ("preferred_batch_size", "4,8")))
    assert serving.batching() is None and serving.encoder_instances == 2 and serving.preferred_batch_size == (4, 8)
    assert TextServing().batching().max_queue_delay_microseconds == TextServing().max_queue_delay_microseconds
    with pytest.raises(SpecError, match="unknown serving setting"):
        TextServing().with_overrides({"dynamic_batchin": "false"})


def test_goal_runs_are_alternated_side_by_side_in_the_middle_of_every_repetition():
    from types import SimpleNamespace

    from benchmarks import text_peers

    keys = ("st_torch_b64", "st_torch_b32", "st_torch_b64_1thread", "st_openvino_b64", "st_onnx_b64", "infinity",
            "tritonpack")
    sides = [SimpleNamespace(key=key, served=key in ("infinity", "tritonpack"), run=lambda texts, c: None)
             for key in keys]
    order = []
    named = {name: (lambda name=name: order.append(name) or Run(1, 1.0))
             for name in text_peers.tasks(sides, [], (1, 8, 32))}
    meters.alternate(named, 2, log=lambda line: None)
    goal = ["st_torch_b64", "st_torch_b32", "tritonpack c=8", "st_openvino_b64", "infinity c=8"]
    first, second = order[:len(named)], order[len(named):]
    start = first.index(goal[0])
    assert first[start:start + len(goal)] == goal and second == first[::-1]
    assert start > 0 and start + len(goal) < len(first)  # other runs before and after: the goals stay in the middle
    assert sorted(first) == sorted(["st_torch_b64_1thread", "st_onnx_b64", "infinity c=1", "infinity c=32",
                                    "tritonpack c=1", "tritonpack c=32"] + goal)
    by_bucket = list(text_peers.tasks([x for x in sides if x.key != "st_torch_b64_1thread"], [], (8,),
                                      named_by_c=False))
    assert by_bucket[by_bucket.index("tritonpack") - 1:by_bucket.index("tritonpack") + 3] == [
        "st_torch_b32", "tritonpack", "st_openvino_b64", "infinity"]


def test_torch_goal_is_judged_against_the_faster_torch_batch_in_each_repetition():
    from types import SimpleNamespace

    from benchmarks import text_peers

    sides = [SimpleNamespace(key=key, served=key == "tritonpack") for key in ("tritonpack", *text_peers.TORCH_BATCHES)]
    runs = {"tritonpack c=8": [Run(200, 1.0), Run(200, 1.0)], "st_torch_b64": [Run(125, 1.0), Run(160, 1.0)],
            "st_torch_b32": [Run(150, 1.0), Run(120, 1.0)]}
    out = text_peers.ratios(runs, sides, 8)
    faster = out[text_peers.FASTER_TORCH]
    assert faster["ratios"] == [200 / 150, 200 / 160] and faster["target"] == 1.5 and faster["met"] is False
    assert out["st_torch_b64"]["target"] is None and out["st_torch_b64"]["met"] is None  # one verdict, not two
    runs["tritonpack c=4"] = runs["tritonpack c=8"]
    assert text_peers.FASTER_TORCH not in text_peers.ratios(runs, sides, 4)


def test_infinity_engine_in_reduced_precision_is_compared_only_where_it_holds_the_cosine_floor(tmp_path):
    from benchmarks import report, text_peers

    bf16 = peers.INFINITY_ENGINES["torch-bf16"]
    command = peers.InfinityServer(tmp_path, bf16, tmp_path, tmp_path / "log").command
    assert command[command.index("--engine") + 1] == "torch" and command[command.index("--dtype") + 1] == "bfloat16"
    assert "--dtype" not in peers.InfinityServer(tmp_path, peers.INFINITY_ENGINES["torch"], tmp_path,
                                                 tmp_path / "log").command
    tried = {"optimum": {"started": True, "probe_c8_sentences_per_s": 70.0, "min_cosine_within_256": 1.0},
             "torch-bf16": {"started": True, "probe_c8_sentences_per_s": 90.0, "min_cosine_within_256": 0.99989},
             "torch": {"started": True, "probe_c8_sentences_per_s": 50.0, "min_cosine_within_256": 1.0},
             "optimum-openvino": {"started": False, "error": "RuntimeError: exited"}}
    assert text_peers.compared_first(tried) == ["optimum", "torch", "torch-bf16"]
    assert "torch-bf16 90.0/s (min cosine 0.999890), torch 50.0/s" in report.engines_tried_line(tried)
    assert "optimum-openvino did not start (RuntimeError: exited)" in report.engines_tried_line(tried)
    tried["torch-bf16"]["min_cosine_within_256"] = 0.9999
    assert text_peers.compared_first(tried)[0] == "torch-bf16"
    tried["torch-bf16"]["min_cosine_within_256"] = float("nan")
    assert text_peers.compared_first(tried)[0] == "optimum"


def test_infinity_engine_that_fails_its_probe_is_recorded_and_closed_while_the_others_are_compared(monkeypatch):
    """Stand-in sides in place of infinity-emb servers: what is tested is the choice and the bookkeeping around the
    probe, not infinity-emb (the bench runs it for real)."""
    from types import SimpleNamespace

    from benchmarks import report, text_peers

    vectors = np.eye(3, dtype=np.float32)

    class Side:
        def __init__(self, engine, per_second, embedded):
            self.details, self.per_second, self.embedded, self.closed = {"engine": engine}, per_second, embedded, False

        def run(self, texts, concurrency):
            if self.per_second is None:
                raise ConnectionResetError("server went away")
            return Run(int(self.per_second), 1.0)

        def embed(self, texts):
            return self.embedded

        def close(self):
            self.closed = True

    sides = {"optimum": Side("optimum", 60, vectors), "torch": Side("torch", None, vectors),
             "torch-bf16": Side("torch-bf16", 90, vectors * 0.5 + 0.01)}
    monkeypatch.setattr(peers.PeerEnv, "versions", lambda self, root: {})
    monkeypatch.setattr(text_peers, "start_infinity", lambda bench, engine, texts, versions: sides[engine.name])
    bench = SimpleNamespace(peers_root=None, log=lambda line: None)
    engines = [peers.INFINITY_ENGINES[name] for name in sides]
    chosen = text_peers.infinity_side(bench, ["a", "b", "c"], engines, (["a", "b", "c"], vectors))
    assert chosen is sides["optimum"] and not chosen.closed and sides["torch"].closed and sides["torch-bf16"].closed
    tried = chosen.details["engines_tried"]
    assert tried["torch"]["error"] == "probe failed: ConnectionResetError: server went away"
    assert tried["torch-bf16"]["min_cosine_within_256"] < 0.9999 < tried["optimum"]["min_cosine_within_256"]
    assert "torch (probe failed: ConnectionResetError: server went away)" in report.engines_tried_line(tried)


def test_sizes_are_judged_in_megabytes_of_a_million_bytes(tmp_path):
    from benchmarks import cold_memory

    tarball = tmp_path / "bert-portable.tar.gz"
    with open(tarball, "wb") as f:
        f.truncate(45_000_001)  # 42.9 MiB: "met" when MiB were called MB
    size = cold_memory.tarball_size(tarball)
    assert size["tarball_mb"] == pytest.approx(45.000001) and size["tarball_met"] is False


def test_a_peer_that_did_not_run_is_not_measured_when_every_peer_was_to_run():
    from benchmarks.report import not_measured

    report = {"settings": {"peers": "all"}, "peers": {"skipped": {"infinity": "did not start: OSError"}},
              "mme": {"available": False, "reason": "no tarball"}}
    assert not_measured(report) == {"mme": "no tarball", "peer infinity": "did not start: OSError"}
    report["settings"]["peers"] = "none"  # smoke mode leaves the peers out on purpose
    assert not_measured(report) == {"mme": "no tarball"}


def test_clients_raise_the_error_when_a_client_cannot_be_made_instead_of_waiting_forever():
    from benchmarks.sides import ConcurrentClients

    def broken():
        raise ImportError("no tritonclient here")

    clients = ConcurrentClients(broken)
    result: list = []
    thread = threading.Thread(target=lambda: result.append(pytest.raises(ImportError, clients.send, [["a"]] * 4, 2)))
    thread.start()
    thread.join(timeout=10)
    clients.close()
    assert not thread.is_alive() and "no tritonclient" in str(result[0].value)


# what tritonserver's log holds for a line the runner logs through pb_utils.Logger at load
TRITON_LOG_LINE = 'I1126 18:43:58.622056 24382 runner_batching.py:139] "{}"\n'


def test_served_and_in_process_encoders_are_labelled_with_what_they_compute_on_this_cpu_not_the_configs_precision(
        build_ensemble, model_folders, python_model, tmp_path):
    from types import SimpleNamespace

    from benchmarks.sides import served_tritonpack
    from benchmarks.text_serving import SameEncoderInProcess
    from tests import fake_pb_utils

    repository = build_ensemble("bert").repository
    in_process = SameEncoderInProcess(repository)
    computes = in_process.runner.session.computes  # the CPU's pick at load: f32 throughout without native bf16
    assert in_process.runtime == f"openvino {computes}; packed ≤ 256 tokens"
    logged = len(fake_pb_utils.Logger.messages)
    python_model(model_folders("bert")["bert_encoder"])  # the served encoder's model.py, logging as in Triton
    log = tmp_path / "tritonserver.log"
    log.write_text("".join(TRITON_LOG_LINE.format(message) for _, message in fake_pb_utils.Logger.messages[logged:]))
    served = served_tritonpack(SimpleNamespace(url="127.0.0.1:1", log_path=log), repository)
    assert served.label == f"served tritonpack bert (openvino {computes})"
    assert served.details["encoder"] == in_process.runtime and served.details["encoder_computes"] == computes


def test_served_encoder_precision_is_unknown_when_the_servers_log_does_not_say(build_ensemble, tmp_path):
    from types import SimpleNamespace

    from benchmarks.sides import served_tritonpack

    log = tmp_path / "tritonserver.log"
    log.write_text(TRITON_LOG_LINE.format("successfully loaded 'bert_encoder'"))
    served = served_tritonpack(SimpleNamespace(url="127.0.0.1:1", log_path=log), build_ensemble("bert").repository)
    assert served.label == "served tritonpack bert (openvino, precision unknown)"  # not the config's bf16
    assert served.details["encoder_computes"] == "unknown"


def test_served_over_same_encoder_row_names_what_each_sides_encoder_computes():
    from benchmarks import report

    same = {"sentences_per_request": 32, "ratio": meters.ratio_summary([Run(32, 1.0)], [Run(32, 1.0)], 0.9),
            "encoder": "openvino bf16, bf16+f32 up to 16 tokens; packed ≤ 256 tokens",
            "served_encoder": "openvino bf16, bf16+f32 up to 16 tokens; packed ≤ 256 tokens"}
    row, = (r for r in report.summary_rows({"served_over_same_encoder": same}) if r["target"] is not None)
    assert row["what"] == "served bert ÷ its own encoder in-process (both openvino bf16, bf16+f32 up to 16 tokens; " \
        "packed ≤ 256 tokens), 32 sentences/request, c=1"
    same["served_encoder"] = "openvino, precision unknown; packed ≤ 256 tokens"
    row, = (r for r in report.summary_rows({"served_over_same_encoder": same}) if r["target"] is not None)
    assert row["what"] == "served bert (openvino, precision unknown; packed ≤ 256 tokens) ÷ its own encoder " \
        "in-process (openvino bf16, bf16+f32 up to 16 tokens; packed ≤ 256 tokens), 32 sentences/request, c=1"


def test_gpu_run_widens_the_carried_fp16_planes_back_to_the_weights_rounded_to_fp16():
    import safetensors.torch
    import torch

    from benchmarks.gpu_run import widen

    weights = {"a": torch.randn(5, 3), "odd": torch.randn(7)}
    fp16 = np.frombuffer(safetensors.torch.save({k: v.half() for k, v in weights.items()}), np.uint8)
    even = len(fp16) - len(fp16) % 2
    planes = fp16[:even].reshape(-1, 2).T.tobytes() + fp16[even:].tobytes()  # as `carry_model` writes them
    widened = widen(planes)
    assert {k: v.dtype for k, v in widened.items()} == {"a": torch.float32, "odd": torch.float32}
    for name, tensor in weights.items():
        assert torch.equal(widened[name], tensor.half().float())


def test_gpu_run_client_gets_the_served_embeddings_tritonclient_gets(served):
    """The GPU run's own HTTP client (no tritonclient there): binary texts in, binary embeddings out; Triton's
    statistics say where each request's time went."""
    from benchmarks.gpu_run import Client, settled_statistics, where_time_went
    from benchmarks.sides import ConcurrentClients
    from tritonpack.client import embed

    server = served("bert_pt")
    texts = ["Hello world", "Ünïcödé and emoji 🚀", ""]
    np.testing.assert_array_equal(Client(server.url, "bert_pt").embed(texts), embed(server.url, "bert_pt", texts))
    clients = ConcurrentClients(lambda: Client(server.url, "bert_pt"))
    before = settled_statistics(server.url)
    try:
        run, answers = clients.send([[t] for t in texts * 4], concurrency=3)  # an error raises
    finally:
        clients.close()
    assert len(answers) == 12 and run.per_second > 0
    spent = where_time_went(before, settled_statistics(server.url))
    assert set(spent) == {"bert_pt", "bert_pt_tokenizer", "bert_pt_encoder"}  # the encoder pools
    assert {name: times["requests"] for name, times in spent.items()} == dict.fromkeys(spent, 12)
    assert spent["bert_pt_tokenizer"]["sentences_per_execution"] == 1  # it runs each request alone
    assert 1 <= spent["bert_pt_encoder"]["sentences_per_execution"] <= 3  # batched: at most the 3 clients' requests
    steps = sum(spent[f"bert_pt_{step}"]["request_ms"] for step in ("tokenizer", "encoder"))
    assert 0 < spent["bert_pt_encoder"]["compute_infer_ms"] < steps <= spent["bert_pt"]["request_ms"] * 1.05


def test_gpu_run_clients_in_several_processes_answer_as_one_process_does(served):
    """`--client-processes`: each process takes every Nth request with its share of the concurrency; the answers come
    back in the requests' order and the run counts every request once."""
    from benchmarks.gpu_run import Client, ProcessClients

    server = served("bert_pt")
    texts = [f"sentence number {i}" for i in range(10)]
    clients = ProcessClients(server.url, "bert_pt", processes=3)
    try:
        run, answers = clients.send([[t] for t in texts], concurrency=4)
        single, _ = clients.send([["alone"]], concurrency=1)  # fewer clients than processes
        pairs, paired = clients.send([texts[i:i + 2] for i in range(0, 10, 2)], concurrency=2)
    finally:
        clients.close()
    expected = Client(server.url, "bert_pt").embed(texts)
    np.testing.assert_allclose(np.concatenate(answers), expected, atol=1e-5)
    assert run.items == 10 and len(run.latencies_ms) == 10 and run.seconds > 0
    assert single.items == 1 and len(single.latencies_ms) == 1
    # items are sentences, not requests: 32 per request would otherwise read 32 times slower
    np.testing.assert_allclose(np.concatenate(paired), expected, atol=1e-5)
    assert pairs.items == 10 and len(pairs.latencies_ms) == 5
