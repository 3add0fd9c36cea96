"""`tritonpack bench --mode smoke` produces the report (files and keys); it never checks a number is reached."""

from __future__ import annotations

import json

import pytest

from tritonpack import bench


def test_corpus_is_deterministic_and_mixed_when_generated():
    sentences = bench.corpus(200, seed=5)
    assert sentences == bench.corpus(200, seed=5)
    words = sorted(len(s.split()) for s in sentences)
    assert words[0] <= 3 and words[-1] >= 30 and len(set(sentences)) > 150


def test_ratio_summary_reports_the_median_of_paired_runs_when_alternated():
    fast = [bench.Run(100, 1.0, cpu_seconds=1.0), bench.Run(100, 2.0, cpu_seconds=2.0), bench.Run(100, 1.0)]
    slow = [bench.Run(100, 2.0, cpu_seconds=2.0), bench.Run(100, 2.0, cpu_seconds=2.0), bench.Run(100, 3.0)]
    summary = bench.ratio_summary(fast, slow, target=1.5)
    assert summary["ratios"] == [2.0, 1.0, 3.0] and summary["median"] == 2.0 and summary["met"] is True
    assert summary["per_cpu_second_median"] == 1.5  # the run without CPU time is left out


@pytest.mark.server
def test_bench_smoke_writes_report_files_with_expected_keys_when_run(test_dist, tmp_path):
    settings = bench.BenchSettings.for_mode("smoke", out=tmp_path / "bench", dist=test_dist)
    report = bench.Bench(settings, log=lambda line: None).run()

    out = tmp_path / "bench"
    assert (out / "report.md").read_text().startswith("# tritonpack bench report")
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(report["summary"]))
    for key in ("machine", "versions", "settings", "corpus", "load", "P1", "client_protocol", "P2", "P3", "P4",
                "P5", "P6", "summary", "plots"):
        assert key in on_disk, key
    assert {"cores", "cpu_model"} <= set(on_disk["machine"])
    for c in settings.concurrencies:
        entry = on_disk["P1"]["by_concurrency"][str(c)]
        assert {"latency_p50_ms", "latency_p99_ms", "throughput_median"} <= set(entry["served"])
        assert {"median", "ratios", "per_cpu_second_median"} <= set(entry["ratio"])
    assert on_disk["P1"]["cosine_min_vs_sentence_transformers"] > 0
    assert {"batch32_c1", "single_c4"} <= set(on_disk["P2"])
    assert "median" in on_disk["P3"]["ratio"]
    assert "available" in on_disk["P4"] and "available" in on_disk["P5"]
    assert {"tarballs_bytes", "envs_bytes"} <= set(on_disk["P6"])
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
