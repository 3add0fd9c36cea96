"""`bert`: tokenizer → MiniLM encoder → mean pooling (all-MiniLM-L6-v2 sentence embeddings).

The encoder is a TensorRT plan on `gpu`, ONNX on `cpu` (ONNX Runtime's fused graph on Triton's onnxruntime
backend, or Triton's openvino backend with `--serving encoder_runtime=openvino`) and on `portable` the packed ONNX
run by OpenVINO in the python runner, which also mean-pools (docs/performance.md).
"""

from __future__ import annotations

from .text import TextRecipe, TextServing

RECIPE = TextRecipe(
    name="bert",
    encoder={"gpu": "tensorrt_plan", "cpu": "onnx", "portable": "onnx"},
    serving={
        "gpu": TextServing(max_batch_size=64, tokenizer_instances=2),
        "cpu": TextServing(max_batch_size=64),
        # portable, measured on 2 CPU cores (docs/performance.md): two single-threaded encoder instances (no intra-op
        # barrier waits on a descheduled thread); OpenVINO in bf16 on CPUs that have it (AVX512_BF16, AMX),
        # embeddings within cosine 0.9999 of PyTorch (checked at build); sentences packed into sequences of ≤ 256
        # real tokens instead of padded batches, mean-pooled inside the packed graph (one python step fewer);
        # 500 µs queue delay so both instances stay busy at c=8.
        "portable": TextServing(max_batch_size=64, encoder_instances=2, encoder_threads=1,
                                max_queue_delay_microseconds=500, encoder_runtime="openvino",
                                encoder_precision="bf16", encoder_pack_tokens=256, encoder_pooling=True),
    },
)
