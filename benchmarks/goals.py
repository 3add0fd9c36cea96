"""The targets the report checks (issue 10), named by what they measure. Wall-clock ratios measured side by side in
one run; "c=8" is eight concurrent clients, one sentence per request."""

CONCURRENCY = 8  # the served sides' clients in every goal below named c=8

SERVED_OVER_ST_OPENVINO_C8 = 1.0  # served bert ÷ in-process sentence-transformers backend="openvino", batch 64
# served bert ÷ in-process sentence-transformers torch at the faster of the batches it runs (64, its default 32)
SERVED_OVER_ST_TORCH_C8 = 1.5
SERVED_OVER_SERVED_PEER_C8 = 3.0  # served bert ÷ the served peer (infinity-emb, its fastest CPU engine), both c=8
SERVED_OVER_SAME_ENCODER_32_PER_REQUEST = 0.9  # served bert ÷ its own encoder in-process, 32 sentences per request
COSINE_MIN = 0.9999  # to sentence-transformers torch, every held-out sentence
ONE_MODEL_PSS_MB = 200.0  # tritonserver + stubs with one bert loaded through the local MME
TARBALL_MB = 45.0  # bert-portable.tar.gz
COLD_START_S = 3.0  # tarball on disk → first answer through the local MME
TEXT_ENV_MB = 50.0  # the packed `text` environment
SERVED_RESNET_OVER_IN_PROCESS = 0.85  # served resnet_pt ÷ the same DALI + TorchScript in-process (issue 5)
