"""Run a TorchScript file with torch, as Triton's pytorch_libtorch backend would (inputs in config order)."""

from __future__ import annotations

import numpy as np
from cpu_quota import cpu_limit


def open_session(path: str, params: dict[str, str]):
    import torch

    threads = int(params.get("threads", "0"))
    if not threads and (limit := cpu_limit()):
        threads = min(limit, torch.get_num_threads())
    if threads:
        torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    module = torch.jit.load(path, map_location=device).eval()
    input_names = params["input_order"].split(",")
    output_names = params["output_order"].split(",")

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            result = module(*(torch.from_numpy(np.ascontiguousarray(inputs[n])).to(device) for n in input_names))
        if isinstance(result, dict):
            result = tuple(result.values())
        if not isinstance(result, (tuple, list)):
            result = (result,)
        return {name: value.float().cpu().numpy() for name, value in zip(output_names, result)}

    run.on_gpu = device.type == "cuda"
    if run.on_gpu:  # once the model is idle (resident_memory.ReleasedWhenIdle): the blocks kept for the next call
        run.release_cached_memory = torch.cuda.empty_cache
    return run
