"""What serving costs: served bert ÷ its own encoder called in-process, and dynamic batching on ÷ off.

The in-process side is the served encoder without Triton: the repository's own encoder file, runtime, precision
and session options, run through the same runner code (packing or length grouping), plus tokenization and pooling
unless the encoder pools. Both sides get the same requests of 32 sentences.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from benchmarks import corpus, goals
from benchmarks.meters import Run, alternate, ratio_summary, side_summary
from benchmarks.sides import describe_encoder, served_tritonpack
from tritonpack import contracts
from tritonpack.components import load_model_module


class SameEncoderInProcess:
    """The served repository's tokenizer, encoder runner and pooling, called in this process (an encoder that reads
    the text runs its tokenizer here, then its runner, as its own queue does)."""

    def __init__(self, repository: Path, model: str = "bert"):
        from google.protobuf.json_format import MessageToDict

        from tritonpack.spec import config_parameters, parse_config

        encoder_dir = repository / f"{model}_encoder"
        config = parse_config((encoder_dir / "config.pbtxt").read_text())
        params = config_parameters(config)
        # the tokenizer's step, or the encoder's own where it reads the text
        tokenizer_dir = encoder_dir if "tokenizer" in params else repository / f"{model}_tokenizer"
        tok_params = config_parameters(parse_config((tokenizer_dir / "config.pbtxt").read_text()))
        runner = load_model_module("framework_runner", "runner_batching")
        session = load_model_module("framework_runner", f"{params['framework']}_session")

        class InProcessRunner(runner.FrameworkRunnerModel):
            def open_session(self, path, params):
                return session.open_session(path, params)

        self.runner = InProcessRunner()
        self.runner.initialize({"model_config": json.dumps(MessageToDict(config, preserving_proto_field_name=True)),
                                "model_repository": str(encoder_dir), "model_version": "1"})
        if self.runner.warming is not None:  # pack shapes warm in the background: not timed
            self.runner.warming.join()
        # the CPU picks the precision at load (and the reference check may fall back): the config only asks for one
        self.runtime = describe_encoder(params, runner.session_computes(self.runner.session))
        self.pool = load_model_module("mean_pooling", "pooling").mean_pool
        tokenizer = load_model_module("tokenizer", "tokenize_text").TextTokenizer
        self.tokenizer = tokenizer.from_parameters(str(tokenizer_dir / "1" / "tokenizer.json"), tok_params,
                                                   "token_type_ids" in self.runner.input_names)

    def embed(self, sentences: list[str]) -> np.ndarray:
        item = self.tokenizer(sentences)
        result = self.runner._run([item])[0]
        if contracts.TEXT.output in result:  # the encoder pools itself
            return result[contracts.TEXT.output]
        return self.pool(result["token_embeddings"], item["attention_mask"], True)

    def run(self, requests: list[list[str]]) -> Run:
        latencies = []
        start = time.perf_counter()
        for batch in requests:
            t = time.perf_counter()
            self.embed(batch)
            latencies.append(1000 * (time.perf_counter() - t))
        return Run(sum(len(b) for b in requests), time.perf_counter() - start, latencies)


def served_over_same_encoder(bench, server) -> dict:
    s = bench.settings
    texts = [x.text for x in corpus.corpus(s.sentences, s.seed)]
    requests = [texts[i:i + s.request_batch] for i in range(0, len(texts), s.request_batch)]
    in_process = SameEncoderInProcess(bench.served_repository)
    served = served_tritonpack(server, bench.served_repository)
    try:
        in_process.run(requests[:1])
        served.run_requests(requests[:2], 1)
        bench.log(f"served bert ÷ the same encoder in-process ({in_process.runtime}), "
                  f"{s.request_batch} sentences per request, c=1")
        runs = alternate({"in-process": lambda: in_process.run(requests),
                          "served c=1": lambda: served.run_requests(requests, 1)}, s.repetitions, bench.log)
    finally:
        served.close()
    return {"sentences_per_request": s.request_batch, "concurrency": 1, "encoder": in_process.runtime,
            "served_encoder": served.details["encoder"],
            "served": side_summary(runs["served c=1"]), "in_process": side_summary(runs["in-process"]),
            "ratio": ratio_summary(runs["served c=1"], runs["in-process"],
                                   goals.SERVED_OVER_SAME_ENCODER_32_PER_REQUEST)}


def dynamic_batching_on_over_off(bench, server) -> dict:
    s = bench.settings
    texts = [x.text for x in corpus.corpus(s.sentences, s.seed)]
    unbatched = bench.build_variant("no-dynamic-batching", serving=(("dynamic_batching", "false"),))
    server_off = bench.serve(unbatched.repository)
    on = served_tritonpack(server, bench.served_repository)
    off = served_tritonpack(server_off, unbatched.repository)
    try:
        for side in (on, off):  # connections and client threads are set up untimed
            side.run(texts[:32], 8)
        bench.log("dynamic batching on ÷ off, one sentence per request at c=8")
        runs = alternate({"batching on": lambda: on.run(texts, 8), "batching off": lambda: off.run(texts, 8)},
                         s.repetitions, bench.log)
    finally:
        on.close()
        off.close()
        bench.stop_server(server_off)
    return {"concurrency": 8, "on": side_summary(runs["batching on"]), "off": side_summary(runs["batching off"]),
            "ratio": ratio_summary(runs["batching on"], runs["batching off"])}
