"""`bert_pt`: tokenizer → BERT encoder as TorchScript (pytorch_libtorch; torch in python on portable) → pooling."""

from __future__ import annotations

from tritonpack.components import Artifact, ModelFolder, framework_model

from .text import SentenceTransformerSource, TextServing, encoder_artifacts, text_ensemble

NAME = "bert_pt"
TARGETS = ("gpu", "cpu", "portable")
SERVING = {"portable": TextServing(), "cpu": TextServing(), "gpu": TextServing(tokenizer_instances=2)}


def models(request, cache) -> list[ModelFolder]:
    source = SentenceTransformerSource.resolve(request.model)
    serving = SERVING[request.target].with_overrides(request.serving)
    # pytorch_libtorch accepts inputs named like the traced forward's arguments; outputs get `__<index>`.
    encoder = framework_model(
        f"{NAME}_encoder", Artifact("torchscript", encoder_artifacts(source, cache)["torchscript"]), request.target,
        source.encoder_inputs(), source.encoder_outputs(), max_batch_size=serving.max_batch_size,
        dynamic_batching=serving.batching(), instances=serving.encoder_instances, threads=serving.encoder_threads,
    )
    return text_ensemble(NAME, source, encoder, serving)
