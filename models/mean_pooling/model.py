"""Triton adapter for `pooling`: token_embeddings + attention_mask → EMBEDDING."""

import json

import triton_python_backend_utils as pb_utils
from batched_requests import ClientError, read_input, respond_all
from pooling import mean_pool
from resident_memory import drop_load_only_file_pages


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.normalize = params["normalize"] == "true"
        self.output_name = config["output"][0]["name"]
        drop_load_only_file_pages()

    def execute(self, requests):
        return respond_all(pb_utils, requests, self._parse, self._pool,
                           lambda e: [pb_utils.Tensor(self.output_name, e)], pb_utils.Logger)

    def _parse(self, request):
        embeddings = read_input(pb_utils, request, "token_embeddings")
        mask = read_input(pb_utils, request, "attention_mask")
        if embeddings.ndim != 3 or mask.shape != embeddings.shape[:2]:
            raise ClientError(f"token_embeddings {list(embeddings.shape)} must be [rows, tokens, hidden] with "
                              f"attention_mask [rows, tokens], got attention_mask {list(mask.shape)}")
        return embeddings, mask

    def _pool(self, items):  # each request as it came: no copy into one batch padded to its longest
        return [mean_pool(embeddings, mask, self.normalize) for embeddings, mask in items]
