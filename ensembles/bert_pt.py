"""`bert_pt`: tokenizer → BERT encoder as TorchScript (pytorch_libtorch; torch in python on portable), which also
mean-pools: its traced graph answers the sentence embedding, so no pooling step and no [tokens × hidden] tensor
between steps (docs/performance.md, fortieth round)."""

from __future__ import annotations

from .text import TextRecipe, TextServing

RECIPE = TextRecipe(
    name="bert_pt",
    encoder={"gpu": "torchscript", "cpu": "torchscript", "portable": "torchscript"},
    serving={"gpu": TextServing(tokenizer_instances=2, encoder_pooling=True),
             "cpu": TextServing(encoder_pooling=True), "portable": TextServing(encoder_pooling=True)},
)
