"""The report: headline rows with their targets, then the tables behind them (dist/bench/report.md, report.json)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import goals, plots
from benchmarks.text_peers import FASTER_TORCH

HOW = """\
How this bench measures:
- **Sides.** In-process peers (sentence-transformers with its torch, OpenVINO and ONNX backends, each in a worker
  process of the environment it installs in) embed the whole workload in one `encode(batch_size=64)` call — no
  request overhead, at the batch the goals name (torch also at its default 32, faster on an AMX Xeon), timed around
  `encode` only; concurrency does not apply to them. Served sides (tritonpack `bert` in the
  bundled tritonserver, infinity-emb, both on loopback) get one sentence per request from c client threads, each
  waiting for its answer before sending the next. Every comparison runs its sides in alternating order in one run
  (A B …, … B A), the goals' sides next to each other (served c=8 between the faster torch batch and the OpenVINO
  backend, then infinity-emb c=8), and reports the median of the per-repetition ratios, their range in brackets.
- **Per CPU-second** divides items by the CPU time of this process and every process group it started (servers
  with their stubs, peer workers) during the run; other processes' load does not bias it.
- **Memory** is the summed PSS of tritonserver and all its python stubs after loading copies of the tarball
  through the local MME: PSS charges a page shared by n processes 1/n to each, so the sum counts every page once
  (summed RSS, shown beside it, counts shared libraries and the stubs' /dev/shm regions once per process)."""


def _row(key: str, what: str, value, unit: str, target=None, met=None, per_cpu=None, higher=True) -> dict:
    return {"key": key, "what": what, "value": value, "unit": unit, "target": target, "met": met,
            "per_cpu_second": per_cpu, "higher_is_better": higher}


def _ratio_row(key: str, what: str, ratio: dict | None) -> list[dict]:
    """The median ratio, with the range of the repetitions' ratios beside it where there were several."""
    if not ratio:
        return []
    row = _row(key, what, ratio["median"], "×", ratio.get("target"), ratio.get("met"),
               ratio.get("per_cpu_second_median"))
    if len(ratio.get("ratios", [])) > 1:
        row["range"] = [min(ratio["ratios"]), max(ratio["ratios"])]
    return [row]


def summary_rows(report: dict) -> list[dict]:
    """One row per headline number: what, measured, target, met."""
    rows = []
    peers = report.get("peers", {})
    at_goal = peers.get("ratios_by_concurrency", {}).get(str(goals.CONCURRENCY), {})
    for key, side in peers.get("sides", {}).items():
        if key in at_goal:
            how = "c=8" if side["served"] else "in-process"
            rows += _ratio_row(f"served_c8_over_{key}", f"served bert c=8 ÷ {side['label']} ({how})", at_goal[key])
    rows += _ratio_row(f"served_c8_over_{FASTER_TORCH}", "served bert c=8 ÷ sentence-transformers torch at the "
                       "faster of its batches 64 and 32, in each repetition (in-process)",
                       at_goal.get(FASTER_TORCH))
    cosine = peers.get("cosine_to_st_torch", {}).get("tritonpack")
    if cosine:
        rows.append(_row("cosine_min", "served bert min cosine to sentence-transformers torch (held-out)",
                         cosine["min"], "", goals.COSINE_MIN, cosine["min"] >= goals.COSINE_MIN))
    same = report.get("served_over_same_encoder", {})
    rows += _ratio_row("served_over_same_encoder_32", _served_over_same_encoder_what(same), same.get("ratio"))
    rows += _ratio_row("dynamic_batching_on_over_off", "batching requests (`dynamic_batching`) on ÷ off, c=8",
                       report.get("dynamic_batching", {}).get("ratio"))
    sizes = report.get("sizes", {})
    for key, suffix, tarball in (("mme", "", "bert"), ("mme_no_env", "_no_env", "bert built --no-env")):
        mme = report.get(key, {})
        memory = mme.get("memory")
        if memory:
            rows.append(_row(f"one_model_pss_mb{suffix}",
                             f"tritonserver + stubs with one {tarball} loaded, idle (PSS, MB)",
                             memory["one_model_total_pss_mb"], "MB", memory["target_one_model_mb"], memory["met"],
                             higher=False))
            rows.append(_row(f"one_model_recently_served_pss_mb{suffix}", "… the same 3 s after its last request "
                             "(PSS, MB)", memory["one_model_recently_served_pss_mb"], "MB", higher=False))
            rows.append(_row(f"one_model_before_vocabulary_pss_mb{suffix}", "… the same before the vocabulary "
                             "(corpus requests only; PSS, MB)", memory["one_model_before_vocabulary_pss_mb"], "MB",
                             higher=False))
            rows.append(_row(f"per_additional_model_mb{suffix}", f"each additional loaded {tarball} (PSS, MB)",
                             memory["per_additional_model_pss_mb"], "MB", higher=False))
            rows.append(_row(f"models_per_gb{suffix}", f"loaded {tarball} models per GB beyond the first",
                             memory["models_per_gb"], ""))
        cold = mme.get("cold_start")
        if cold:
            rows.append(_row(f"cold_start_s{suffix}", f"local MME: {tarball} tarball on disk → first answer (s)",
                             cold["first_answer_s_median"], "s", cold["target_s"], cold["met"], higher=False))
        size = sizes if key == "mme" else mme  # the default tarball's size is measured with the environments'
        if "tarball_mb" in size:
            rows.append(_row(f"tarball_mb{suffix}", f"{size['tarball']}: {tarball} (MB)", size["tarball_mb"], "MB",
                             size["tarball_target_mb"], size["tarball_met"], higher=False))
    if sizes.get("text_env_mb") is not None:
        rows.append(_row("text_env_mb", "packed text environment (MB)", sizes["text_env_mb"], "MB",
                         sizes["text_env_target_mb"], sizes["text_env_met"], higher=False))
    image = report.get("images", {})
    rows += _ratio_row("served_resnet_over_in_process", "served resnet_pt ÷ DALI + TorchScript in-process",
                       image.get("served_over_in_process"))
    rows += _ratio_row("dali_over_pil", "DALI CPU preprocessing ÷ PIL/numpy", image.get("dali_over_pil"))
    return rows


def _served_over_same_encoder_what(same: dict) -> str:
    """Names what each side's encoder computes: the served one's from its log, which may not say."""
    served, in_process = same.get("served_encoder"), same.get("encoder")
    sides = f"served bert ÷ its own encoder in-process (both {served})" if served == in_process else \
        f"served bert ({served}) ÷ its own encoder in-process ({in_process})"
    return f"{sides}, {same.get('sentences_per_request')} sentences/request, c=1"


def fmt(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def row_value(row: dict) -> str:
    value = fmt(row["value"], 6 if row["key"] == "cosine_min" else 2) + row["unit"]
    if "range" in row:  # a ratio's repetitions
        value += " ({}–{})".format(*(fmt(x) for x in row["range"]))
    return value


def _table(header: list[str], rows: list[list[str]], numbers: bool = True) -> list[str]:
    """Markdown; the first column left-aligned, the others right-aligned when they hold numbers."""
    align = "---:" if numbers else "---"
    return ["| " + " | ".join(header) + " |", "|---|" + "|".join(align for _ in header[1:]) + "|"] + \
        ["| " + " | ".join(r) + " |" for r in rows]


def _peer_tables(peers: dict) -> list[str]:
    sides = peers["sides"]
    cs = [int(c) for c in peers["ratios_by_concurrency"]]
    by_c = peers["by_concurrency"]
    lines = ["## Peers side by side", "", peers["how"] + ".", ""]
    lines += _table(["side", "runs as", "versions"], [
        [s["label"], s["server"] if s["served"] else f"in-process (a worker in {s['environment']})",
         ", ".join(f"{k} {v}" for k, v in s["versions"].items())] for s in sides.values()], numbers=False)
    for name, why in peers.get("skipped", {}).items():
        lines.append(f"\nSkipped: **{name}** — {why}.")
    engines = sides.get("infinity", {}).get("engines_tried", {})
    if len(engines) > 1:
        lines.append("\n" + engines_tried_line(engines))
    rows = []
    for key, side in sides.items():
        if side["served"]:
            cells = [by_c[f"{key} c={c}"] for c in cs]
            rows.append([side["label"], ""] + [f"{x['throughput_median']:.1f} ({fmt(x['latency_p50_ms'], 1)} / "
                                               f"{fmt(x['latency_p99_ms'], 1)})" for x in cells])
        else:
            rows.append([side["label"], f"{by_c[key]['throughput_median']:.1f}"] + [""] * len(cs))
    lines += ["", "Sentences/s on the mixed corpus; served sides by concurrency, with p50 / p99 ms per request:", ""]
    lines += _table(["side", "in-process, one call"] + [f"c={c}" for c in cs], rows)
    buckets = list(peers["by_bucket"])
    rows = []
    for key, side in sides.items():
        if buckets and key in peers["by_bucket"][buckets[0]]:
            rows.append([side["label"]] + [f"{peers['by_bucket'][b][key]['throughput_median']:.1f}" for b in buckets])
    lines += ["", f"Sentences/s by length bucket (tokens; served sides at c={peers['bucket_concurrency']}):", ""]
    lines += _table(["side"] + buckets, rows)
    rows = [[sides[k]["label"], fmt(v["within_256_tokens"], 6), fmt(v["beyond_256_tokens"], 6)]
            for k, v in peers["cosine_to_st_torch"].items()]
    lines += ["", "Min cosine to sentence-transformers torch on held-out sentences:", ""]
    lines += _table(["side", "≤ 256 tokens", "> 256 tokens (truncated)"], rows)
    return lines


def engines_tried_line(engines: dict[str, dict]) -> str:
    tried = ", ".join(_engine_tried(name, t) for name, t in engines.items())
    return (f"infinity-emb's engines at c=8 on the corpus, with their min cosine to sentence-transformers torch on the "
            f"held-out sentences within 256 tokens: {tried}; the fastest of those at or above {goals.COSINE_MIN} is "
            f"compared.")


def _engine_tried(name: str, tried: dict) -> str:
    if not tried["started"]:
        return f"{name} did not start ({tried['error']})"
    if "error" in tried:  # its probe failed
        return f"{name} ({tried['error']})"
    return (f"{name} {fmt(tried.get('probe_c8_sentences_per_s'), 1)}/s "
            f"(min cosine {fmt(tried.get('min_cosine_within_256'), 6)})")


def _memory_table(mme: dict, title: str) -> list[str]:
    memory = mme["memory"]
    alone = memory["server_only"]
    rows = [["0 (server only)", "–", "–", f"{alone['pss_mb']:.0f}", f"{alone['rss_mb']:.0f}",
             str(alone["processes"]), "0"]]
    rows += [[n, f"{m['before_vocabulary_pss_mb']:.0f}", f"{m['recently_served_pss_mb']:.0f}", f"{m['pss_mb']:.0f}",
              f"{m['rss_mb']:.0f}", str(m["processes"]), str(m["stub_processes_started"])]
             for n, m in memory["steps"].items()]
    loads = ", ".join(fmt(s) for s in memory["first_answer_s_by_target"].values() if s is not None)
    checks = ", ".join(fmt(s) for s in memory.get("check_s_by_target", {}).values())
    lines = [f"## Memory and cold start through the local MME: {title}", ""]
    lines += _table(["loaded copies", "PSS before the step's vocabulary (MB)", "PSS 3 s after it (MB)",
                     "PSS summed, idle (MB)", "RSS summed, idle (MB)", "processes", "stubs seen"], rows)
    lines += ["", f"Each step: {memory['requests_per_step']} corpus requests over the loaded copies (PSS before the "
                  f"step's vocabulary), then every whole word of the vocabulary ({memory['vocabulary_words']}) once to "
                  "each copy loaded in that step, as varied traffic reads the embedding table over time (PSS 3 s after "
                  f"the last request, then PSS and RSS summed {fmt(memory.get('idle_wait_s'), 1)} s after it, when "
                  "the models have released what they hold only for their next call; the PSS before the vocabulary "
                  "is taken idle too). Stubs seen: python stub processes seen since the server started (one per "
                  "python step of each copy, and as many more for each copy Triton reloaded: docs/performance.md, "
                  "sixteenth round)."]
    cold = ", ".join(f"{r['first_answer_s']:.2f} (gateway {r['gateway_s']:.2f}: check and unpacking "
                     f"{r['check_s']:.2f}, placing {r['extract_s']:.2f}; Triton {r['triton_load_s']:.2f})"
                     for r in mme["cold_start"]["runs"])
    stock = ", ".join(f"{r['first_answer_s']:.2f}" for r in mme["cold_start"]["stock_endpoint"]["runs"])
    python = mme.get("stub_python")
    ran = (f"The stub of the container's Python ({python}) ran each copy's packed environment, as on the endpoint "
           f"(`--container-python {python}`). " if mme.get("container_python") else
           f"The local stub (Python {python}) ran the copies. " if python else "")
    lines += ["", f"{ran}First model {memory['first_model_pss_mb']:.0f} MB beyond the server alone; each additional "
                  f"{fmt(memory['per_additional_model_pss_mb'], 0)} MB → {fmt(memory['models_per_gb'], 1)} models "
                  f"per GB. Cold starts (s) with the container environment `tritonpack deploy` sets: {cold}; "
                  f"alternating with them, a stock endpoint's (auto-complete on): {stock}; first answers of the "
                  f"copies loaded next (s): {loads or '–'}; the gateway's check of each (s): {checks or '–'}, "
                  f"inflating {memory.get('environments_inflated', '–')} packed environment(s) in all (a copy's is "
                  f"the first's bytes)."]
    if memory.get("stopped"):
        lines.append(f"\nThe ladder {memory['stopped']}.")
    return lines


def render_markdown(report: dict) -> str:
    m, load = report["machine"], report.get("load", {})
    flags = ", ".join(f for f, present in m["cpu_flags"].items() if present) or "none of the tracked ones"
    lines = [
        "# tritonpack bench report", "",
        f"Mode **{report['mode']}**, started {report['started']}, took {report.get('duration_s', 0):.0f} s.", "",
        f"Machine: **{m['cpu_model']}** (family/model/stepping {m.get('cpu_family_model_stepping', '?')}), "
        f"{m['cores']} cores, flags {flags}; {m['memory_gb']} GB, {m['platform']}, "
        f"Python {m['python']}. Load average (1 min) during the run: min {load.get('load1_min', 0):.1f}, median "
        f"{load.get('load1_median', 0):.1f}, max {load.get('load1_max', 0):.1f}.{_throughput_probe(report)}", "",
        HOW, "",
        "## Results", "", "| | measured | per CPU-second | target | met |", "|---|---:|---:|---:|:---:|",
    ]
    for row in report["summary"]:
        met = "–" if row["met"] is None else ("yes" if row["met"] else "**no**")
        target = "–" if row["target"] is None else f"{'≥' if row['higher_is_better'] else '≤'} {row['target']}"
        cpu = f"{row['per_cpu_second']:.2f}×" if row.get("per_cpu_second") else "–"
        lines.append(f"| {row['what']} | {row_value(row)} | {cpu} | {target} | {met} |")
    if report.get("peers", {}).get("sides"):
        lines += [""] + _peer_tables(report["peers"])
    for key, title in (("mme", "the bert tarball with its packed environment"),
                       ("mme_no_env", "the bert tarball built --no-env (the server's Python has the packages)")):
        if report.get(key, {}).get("memory"):
            lines += [""] + _memory_table(report[key], title)
    lines += [f"\n{k}: not measured — {why}" for k, why in not_measured(report).items()]
    lines += ["", "## Versions", "", ", ".join(f"{k} {v}" for k, v in report["versions"].items()), "",
              "## Settings", "", "```json", json.dumps(report["settings"], indent=1), "```"]
    busy = report.get("other_processes_at_start", []) + report.get("other_processes_at_end", [])
    if busy:
        lines += ["", "Busiest other processes (start, end):", ""]
        lines += [f"- {b['cpu_percent']}% `{b['command'][:100]}`" for b in busy]
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in report.get("plots", []))]
    return "\n".join(lines) + "\n"


def _throughput_probe(report: dict) -> str:
    """The sentence giving the machine's rates at the run's start and end; "" for a report without them."""
    start, end = report.get("cpu_throughput_at_start"), report.get("cpu_throughput_at_end")
    if not start or not end:
        return ""
    rates = ", ".join(f"{what} {start[key]:.0f} → {end[key]:.0f}{unit}" for what, key, unit in (
        ("f32", "f32_matmul_gflops", ""), ("bf16", "bf16_matmul_gflops", " GFLOP/s"),
        ("a Python loop", "python_loop_million_per_s", " M additions/s")))
    return (f" The machine's rates at the start → end of the run (torch's 512×512 matrix product on "
            f"{start['threads']} threads; runs compare across hours only as far as these agree): {rates}.")


def write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["summary"] = summary_rows(report)
    try:
        report["plots"] = plots.write(report, out)
    finally:  # a plotting failure does not lose the run's measurements
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))


def not_measured(report: dict) -> dict[str, str]:
    """Experiment → why it failed (`Bench.attempt` records it and lets the others run), and in a run that makes every
    peer (`--peers all`, `make bench`) each peer that did not run."""
    failed = {key: value["reason"] for key, value in report.items()
              if isinstance(value, dict) and value.get("available") is False}
    if report.get("settings", {}).get("peers") == "all":  # every peer was to run: one that did not leaves a goal
        failed |= {f"peer {name}": why for name, why in report.get("peers", {}).get("skipped", {}).items()}
    return failed
