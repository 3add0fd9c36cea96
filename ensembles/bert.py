"""`bert`: tokenizer → MiniLM encoder → mean pooling (all-MiniLM-L6-v2 sentence embeddings).

The encoder is a TensorRT plan on `gpu`, ONNX on `cpu` (ONNX Runtime's fused graph on Triton's onnxruntime
backend, or Triton's openvino backend with `--serving encoder_runtime=openvino`) and on `portable` the packed export
as OpenVINO IR (weights in fp16) run by OpenVINO in the python runner, which also tokenizes and mean-pools: one
step (docs/performance.md).
"""

from __future__ import annotations

from .text import TextRecipe, TextServing

RECIPE = TextRecipe(
    name="bert",
    encoder={"gpu": "tensorrt_plan", "cpu": "onnx", "portable": "onnx"},
    serving={
        # the encoder's batcher waits 100 µs, as measured for bert_pt on a GPU (docs/performance.md, forty-second round)
        "gpu": TextServing(max_batch_size=64, tokenizer_instances=2, max_queue_delay_microseconds=100),
        "cpu": TextServing(max_batch_size=64),
        # portable, measured in docs/performance.md: OpenVINO in bf16 on CPUs that have it (AVX512_BF16, AMX), fp32
        # elsewhere, embeddings within cosine 0.9999 of PyTorch (checked at build); sentences packed into sequences of
        # ≤ 256 real tokens instead of padded batches, mean-pooled inside the graph into 64 fixed sentence slots (no
        # pooling step; memory flat under any traffic); weights stored in fp16 (half the tarball); one encoder
        # process using every CPU it may (threads 0: chosen at load, one OpenVINO stream per 4 CPUs) instead of one
        # process per core, which held the weights once per process. The encoder reads the text and batches requests
        # itself (`encoder_tokenizes`): no tokenizer process (−19 MB per loaded model) and one hop fewer; the price,
        # requests it has queued are never answered by Triton 2.51 if its stub dies (docs/performance.md,
        # fifty-eighth round; the local MME restarts Triton for them). With a tokenizer step in front
        # (`encoder_tokenizes=false`), Triton's batcher waits 500 µs for the encoder.
        "portable": TextServing(max_batch_size=64, encoder_instances=1, encoder_threads=0,
                                max_queue_delay_microseconds=500, encoder_runtime="openvino",
                                encoder_precision="bf16", encoder_pack_tokens=256, encoder_pooling=True,
                                encoder_pack_rows=64, encoder_weights="fp16", encoder_tokenizes=True),
    },
)
