"""`bert_pt`: tokenizer → BERT encoder as TorchScript (pytorch_libtorch; torch in python on portable) → pooling."""

from __future__ import annotations

from .text import TextRecipe, TextServing

RECIPE = TextRecipe(
    name="bert_pt",
    encoder={"gpu": "torchscript", "cpu": "torchscript", "portable": "torchscript"},
    serving={"gpu": TextServing(tokenizer_instances=2), "cpu": TextServing(), "portable": TextServing()},
)
