"""`bert`: tokenizer → MiniLM encoder (TensorRT on gpu; OpenVINO bf16 on portable, ONNX Runtime on cpu) → mean
pooling."""

from __future__ import annotations

from tritonpack.components import Artifact, ModelFolder, framework_model
from tritonpack.spec import SpecError

from .text import (
    SentenceTransformerSource,
    TextServing,
    encoder_artifacts,
    fused_encoder_onnx,
    openvino_encoder_onnx,
    packed_encoder_onnx,
    text_ensemble,
)

NAME = "bert"
TARGETS = ("gpu", "cpu", "portable")
SERVING = {
    # portable, measured on 2 CPU cores (docs/performance.md): two single-threaded encoder instances (no intra-op
    # barrier waits on a descheduled thread); OpenVINO in bf16 on CPUs that have it (AVX512_BF16, AMX), embeddings
    # within cosine 0.9999 of PyTorch (checked at build); sentences packed into sequences of ≤ 256 real tokens
    # instead of padded batches, mean-pooled inside the packed graph (one python step fewer); 500 µs queue delay
    # so both instances stay busy at c=8.
    "portable": TextServing(max_batch_size=64, encoder_instances=2, encoder_threads=1, max_queue_delay_microseconds=500,
                            encoder_runtime="openvino", encoder_precision="bf16", encoder_pack_tokens=256,
                            encoder_pooling=True),
    "cpu": TextServing(max_batch_size=64),
    "gpu": TextServing(max_batch_size=64, tokenizer_instances=2),
}


def models(request, cache) -> list[ModelFolder]:
    source = SentenceTransformerSource.resolve(request.model)
    onnx = encoder_artifacts(source, cache)["onnx"]
    serving = SERVING[request.target].with_overrides(request.serving)
    if request.target == "gpu":
        if serving.encoder_runtime != "onnxruntime":
            raise SpecError("bert: the gpu target runs its encoder with TensorRT; encoder_runtime is for cpu/portable")
        artifact = Artifact("tensorrt_plan", text_encoder_plan(onnx, source, serving, request.fp16, cache))
    else:
        packed = serving.encoder_pack_tokens > 0
        if packed:
            onnx = packed_encoder_onnx(source, cache, pooled=serving.encoder_pooling)
        if serving.encoder_runtime == "openvino":
            precision = serving.encoder_precision
            artifact = Artifact("openvino", openvino_encoder_onnx(source, onnx, precision, packed, cache), precision,
                                packed=packed)
        elif packed:
            artifact = Artifact("onnx", onnx, packed=True)
        else:  # ONNX Runtime runs the fused graph: 1.15× served throughput measured (docs/performance.md)
            artifact = Artifact("onnx", fused_encoder_onnx(source, onnx, cache))
    outputs = (source.embedding_output(),) if serving.encoder_pooling else source.encoder_outputs()
    encoder = framework_model(
        f"{NAME}_encoder", artifact, request.target, source.encoder_inputs(), outputs,
        max_batch_size=serving.max_batch_size, dynamic_batching=serving.batching(),
        instances=serving.encoder_instances, threads=serving.encoder_threads,
        max_pack_tokens=serving.encoder_pack_tokens,
    )
    return text_ensemble(NAME, source, encoder, serving)


def text_encoder_plan(onnx, source, serving, fp16, cache):
    """Profile over batch 1..max_batch_size and sequence 1..max_seq_length, tuned for short sentences."""
    from tritonpack.build.build_tensorrt import ShapeProfile, build_plan

    batch, seq = serving.max_batch_size, source.max_seq_length
    profiles = [ShapeProfile(t.name, (1, 1), (max(1, batch // 2), min(128, seq)), (batch, seq))
                for t in source.encoder_inputs()]
    plan = cache / f"{onnx.parent.name}-{'fp16' if fp16 else 'fp32'}-b{batch}.plan"
    return plan if plan.exists() else build_plan(onnx, plan, profiles, fp16=fp16)
