"""`bert`: tokenizer → MiniLM encoder (TensorRT on gpu, ONNX Runtime on cpu/portable) → mean pooling."""

from __future__ import annotations

from ensembles.text import (
    SentenceTransformerSource,
    TextServing,
    encoder_artifacts,
    fused_encoder_onnx,
    text_ensemble,
)
from tritonpack.components import Artifact, ModelFolder, framework_model

NAME = "bert"
TARGETS = ("gpu", "cpu", "portable")
SERVING = {
    # 2 CPU cores: two single-threaded encoder instances beat one instance using both cores (2.2× measured at
    # c=8 with other processes on the CPU: no intra-op barrier waits on a descheduled thread, no spinning);
    # see docs/performance.md.
    "portable": TextServing(max_batch_size=64, encoder_instances=2, encoder_threads=1),
    "cpu": TextServing(max_batch_size=64),
    "gpu": TextServing(max_batch_size=64, tokenizer_instances=2),
}


def models(request, cache) -> list[ModelFolder]:
    source = SentenceTransformerSource.resolve(request.model)
    onnx = encoder_artifacts(source, cache)["onnx"]
    serving = SERVING[request.target].with_overrides(request.serving)
    if request.target == "gpu":
        artifact = Artifact("tensorrt_plan", text_encoder_plan(onnx, source, serving, request.fp16, cache))
    else:  # ONNX Runtime runs the fused graph: 1.15× served throughput measured (docs/performance.md)
        artifact = Artifact("onnx", fused_encoder_onnx(source, onnx, cache))
    encoder = framework_model(
        f"{NAME}_encoder", artifact, request.target, source.encoder_inputs(), source.encoder_outputs(),
        max_batch_size=serving.max_batch_size, dynamic_batching=serving.batching(),
        instances=serving.encoder_instances, threads=serving.encoder_threads,
    )
    return text_ensemble(NAME, source, encoder, serving)


def text_encoder_plan(onnx, source, serving, fp16, cache):
    """Profile over batch 1..max_batch_size and sequence 1..max_seq_length, tuned for short sentences."""
    from build.build_tensorrt import ShapeProfile, build_plan

    batch, seq = serving.max_batch_size, source.max_seq_length
    profiles = [ShapeProfile(t.name, (1, 1), (max(1, batch // 2), min(128, seq)), (batch, seq))
                for t in source.encoder_inputs()]
    plan = cache / f"{onnx.parent.name}-{'fp16' if fp16 else 'fp32'}-b{batch}.plan"
    return plan if plan.exists() else build_plan(onnx, plan, profiles, fp16=fp16)
