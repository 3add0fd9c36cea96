"""The bench (`make bench`, `python -m benchmarks`): what tritonpack's served ensembles cost and how they compare.

Not part of the product package; it imports `tritonpack` and is run from the repository root.

    corpus        the sentences, in length buckets of MiniLM tokens
    meters        timed runs, CPU seconds, load average, machine and versions
    sides         one interface for in-process and served sides; tritonpack's served side
    peer_worker   sentence-transformers in its own process (and venv), answering JSON lines
    peers         the peers' venvs and infinity-emb
    text_peers    served bert side by side with its peers, by concurrency and by length
    text_serving  served ÷ the same encoder in-process; dynamic batching on ÷ off
    images        served resnet_pt ÷ in-process; DALI ÷ PIL
    cold_memory   cold start and memory per loaded model through the local MME; sizes
    goals         the targets the report checks
    report, plots report.md, report.json and the PNGs
    run           settings and the order of the experiments
"""
