"""Triton adapter for `tokenize_text`: TEXT (TYPE_STRING [1], batched) → input_ids, attention_mask[, token_type_ids]."""

import json
import os

import triton_python_backend_utils as pb_utils
from batched_requests import respond_all
from resident_memory import ReleasedWhenIdle, drop_load_only_file_pages
from tokenize_text import TextInput, TextTokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.text = TextInput.from_config(config, params)
        self.output_names = [o["name"] for o in config["output"]]
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = TextTokenizer.from_parameters(os.path.join(folder, "tokenizer.json"), params,
                                                       "token_type_ids" in self.output_names)
        drop_load_only_file_pages()  # the imports' and the vocabulary parse's pages (docs/performance.md, 24th round)
        self.released_when_idle = ReleasedWhenIdle()

    def execute(self, requests):
        with self.released_when_idle:
            return respond_all(pb_utils, requests, self._parse, self.tokenizer.per_request, self._tensors,
                               pb_utils.Logger)

    def finalize(self):
        self.released_when_idle.close()

    def _parse(self, request):
        return self.text.read(pb_utils, request)

    def _tensors(self, result):
        return [pb_utils.Tensor(name, result[name]) for name in self.output_names]
