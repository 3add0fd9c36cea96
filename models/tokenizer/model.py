"""Triton adapter for `tokenize_text`: TEXT (TYPE_STRING [1], batched) → input_ids, attention_mask[, token_type_ids]."""

import json
import os

import triton_python_backend_utils as pb_utils
from batched_requests import read_input, respond_all
from tokenize_text import TextTokenizer, decode_texts


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.input_name = config["input"][0]["name"]
        self.output_names = [o["name"] for o in config["output"]]
        self.max_text_bytes = int(params["max_text_bytes"])
        self.max_batch_size = int(config["max_batch_size"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = TextTokenizer.from_parameters(os.path.join(folder, "tokenizer.json"), params,
                                                       "token_type_ids" in self.output_names)

    def execute(self, requests):
        return respond_all(pb_utils, requests, self._parse, self.tokenizer.per_request, self._tensors,
                           pb_utils.Logger)

    def _parse(self, request):
        return decode_texts(read_input(pb_utils, request, self.input_name), self.max_text_bytes, self.max_batch_size)

    def _tensors(self, result):
        return [pb_utils.Tensor(name, result[name]) for name in self.output_names]
