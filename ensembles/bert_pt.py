"""`bert_pt`: tokenizer → BERT encoder as TorchScript (pytorch_libtorch; torch in python on portable) → pooling.

On `portable` the traced graph also mean-pools, so the ensemble is tokenizer → encoder: no pooling process and no
[tokens × hidden] tensor between steps (docs/performance.md, fortieth round); `cpu`/`gpu` keep the reusable pooling
step (`--serving encoder_pooling=true` pools in their graph too).

The encoder's batcher waits 100 µs, not 2 ms: at low load a longer wait only delays each request, and under load
batches form while the encoder computes (portable served on an H200 and on a CPU, docs/performance.md, forty-second
round).

Served portable on a GPU, two tokenizer and two encoder instances answered 1.43x the defaults at c=64 on an H200;
on a 2-vCPU CPU the same ran 0.20x at c=8 (forty-seventh round), so they are named by the build, not the default.
"""

from __future__ import annotations

from .text import TextRecipe, TextServing

RECIPE = TextRecipe(
    name="bert_pt",
    encoder={"gpu": "torchscript", "cpu": "torchscript", "portable": "torchscript"},
    serving={"gpu": TextServing(tokenizer_instances=2, max_queue_delay_microseconds=100),
             "cpu": TextServing(max_queue_delay_microseconds=100),
             "portable": TextServing(encoder_pooling=True, max_queue_delay_microseconds=100)},
    portable_on_gpu=(("tokenizer_instances", "2"), ("encoder_instances", "2")),
)
