"""Runs the serialized DALI pipeline (`model.dali`) with DALI on the CPU (the `portable` target's DALI step)."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from batched_requests import ClientError, read_input, respond_all
from image_header import check_image_pixels
from resident_memory import ReleasedWhenIdle, drop_load_only_file_pages
from serialized_pipeline import PipelineRunFailed, SerializedPipeline, rows_to_samples

DEFAULT_MAX_IMAGE_PIXELS = 50_000_000  # ~7000×7000; a config parameter `max_image_pixels` overrides it


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        # decompression-bomb guard, checked from the header before DALI decodes (README, "Limits")
        self.max_image_pixels = int(params.get("max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS))
        path = os.path.join(args["model_repository"], args["model_version"], params.get("artifact", "model.dali"))
        self.pipeline = SerializedPipeline.from_file(path, input_name=self.input_name,
                                                     max_batch_size=max(1, int(config["max_batch_size"])),
                                                     num_threads=int(params.get("num_threads", "1")))
        drop_load_only_file_pages()
        self.released_when_idle = ReleasedWhenIdle()

    def execute(self, requests):
        with self.released_when_idle:
            return respond_all(pb_utils, requests, self._parse, self._run,
                               lambda rows: [pb_utils.Tensor(self.output_name, rows)], pb_utils.Logger)

    def _parse(self, request):
        """The request's images and the pixels each header claims."""
        try:
            samples = rows_to_samples(read_input(pb_utils, request, self.input_name))
        except ValueError as e:
            raise ClientError(str(e)) from None
        return [(sample, check_image_pixels(sample.tobytes(), self.max_image_pixels, f"{self.input_name}[{i}]"))
                for i, sample in enumerate(samples)]

    def _run(self, items):
        """Every image of every request, in pipeline runs that together decode at most `max_image_pixels` (DALI
        decodes a run's images at once and keeps the buffers: 128 images at the limit would hold ~19 GB)."""
        images = [image for samples in items for image in samples]
        try:
            outputs = self.pipeline.run([sample for sample, _ in images], [pixels for _, pixels in images],
                                        self.max_image_pixels)
        except PipelineRunFailed as e:
            raise ClientError(f"{self.input_name}: {e}") from None
        results, start = [], 0
        for samples in items:
            results.append(np.stack(outputs[start:start + len(samples)]).astype(np.float32, copy=False))
            start += len(samples)
        return results

    def finalize(self):
        self.released_when_idle.close()
        self.pipeline = None

