"""Export a sentence-transformers BERT-family encoder to ONNX and TorchScript, checked against PyTorch.

    python -m tritonpack.build.export_text_encoder MODEL_DIR OUT_DIR [--opset 17]

Both artifacts take input_ids, attention_mask[, token_type_ids] (INT64 [batch, seq]) and return
token_embeddings (FP32 [batch, seq, hidden]); batch and sequence axes are dynamic.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

MAX_ABS_DIFF = 1e-4  # on real (unpadded) tokens, against the PyTorch forward
MIN_EMBEDDING_COSINE = 0.9999  # mean-pooled, against the PyTorch forward, for reduced-precision runtimes
CHECK_TEXTS = [
    "",
    "A short one.",
    "Mixed lengths make padding matter: this sentence is quite a bit longer than the others in the batch.",
    "Ünïcödé, emoji 🚀 and 中文 too.",
]


def _load(model_dir: Path):
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager").eval()

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state

    return TokenEmbeddings(model).eval()


def _load_packed(model_dir: Path, pooled: bool = False, normalize: bool = False):
    """The encoder taking several sentences as one sequence (models/framework_runner/packing.py): attention stays
    inside a sentence (block-diagonal additive mask from `segment_ids`) and `position_ids` restart for each one, so
    every sentence gets exactly its unpacked embeddings. `pooled`: return each sentence's mean over its tokens
    ([sentences, hidden], L2-normalised with `normalize`) instead of the token embeddings ([1, tokens, hidden])."""
    import torch

    encoder = _load(model_dir).encoder

    class PackedTokenEmbeddings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, position_ids, segment_ids, token_type_ids=None):
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            bias = torch.zeros(same.shape, dtype=torch.float32).masked_fill(~same, torch.finfo(torch.float32).min)
            kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            tokens = self.encoder(input_ids=input_ids, attention_mask=bias[:, None], position_ids=position_ids,
                                  **kwargs).last_hidden_state
            if not pooled:
                return tokens
            members = (segment_ids[0][None, :] == torch.arange(segment_ids.max() + 1)[:, None]).to(tokens.dtype)
            means = members @ tokens[0] / members.sum(1, keepdim=True)
            return torch.nn.functional.normalize(means, dim=1, eps=1e-12) if normalize else means

    return PackedTokenEmbeddings().eval()


def _runner_module(name: str):
    """A numpy-only module of the portable runner (models/framework_runner/<name>.py), so the build packs and
    configures exactly as the served model does."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "models" / "framework_runner" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tritonpack_build_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pack(inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[int]]:
    """Right-padded rows (input_ids, attention_mask[, token_type_ids]) → one packed row, and each row's length."""
    lengths = [max(int(m.sum()), 1) for m in inputs["attention_mask"]]
    rows = [{n: inputs[n][r, :length] for n in ("input_ids", "token_type_ids") if n in inputs}
            for r, length in enumerate(lengths)]
    return _runner_module("packing").packed_inputs(rows), lengths


def unpack(packed_output: np.ndarray, lengths: list[int], width: int) -> np.ndarray:
    """[1, tokens, hidden] → [rows, width, hidden], each row's tokens first and zeros after."""
    out = np.zeros((len(lengths), width) + packed_output.shape[2:], dtype=packed_output.dtype)
    for r, row in enumerate(_runner_module("packing").unpacked(packed_output, lengths)):
        out[r, :len(row)] = row
    return out


def _check_inputs(model_dir: Path, input_names: list[str], max_length: int) -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=0)
    encodings = tokenizer.encode_batch(CHECK_TEXTS)
    arrays = {"input_ids": [e.ids for e in encodings], "attention_mask": [e.attention_mask for e in encodings],
              "token_type_ids": [e.type_ids for e in encodings]}
    return {n: np.array(arrays[n], dtype=np.int64) for n in input_names}


def max_diff_on_real_tokens(expected: np.ndarray, actual: np.ndarray, mask: np.ndarray) -> float:
    real = mask.astype(bool)
    return float(np.abs(expected[real] - actual[real]).max())


def export(model_dir: Path, out_dir: Path, input_names: list[str], max_length: int,
           opset: int = 17) -> dict[str, Path]:
    """Write `model.onnx` and `model.pt` into out_dir; raises if either differs from PyTorch."""
    import onnxruntime as ort
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    module = _load(model_dir)
    inputs = _check_inputs(model_dir, input_names, max_length)
    tensors = tuple(torch.from_numpy(inputs[n]) for n in input_names)
    with torch.inference_mode():
        expected = module(*tensors).numpy()

    onnx_path = out_dir / "model.onnx"
    axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    axes["token_embeddings"] = {0: "batch", 1: "sequence"}
    # Tracing warns about Python-level shape logic in transformers; the numeric checks below decide instead.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tensors, str(onnx_path), input_names=input_names,
                          output_names=["token_embeddings"], dynamic_axes=axes, opset_version=opset, dynamo=False)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    onnx_diff = max_diff_on_real_tokens(expected, session.run(None, inputs)[0], inputs["attention_mask"])

    pt_path = out_dir / "model.pt"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, tensors, strict=False)
    traced.save(str(pt_path))
    with torch.inference_mode():
        pt_diff = max_diff_on_real_tokens(expected, torch.jit.load(str(pt_path))(*tensors).numpy(),
                                          inputs["attention_mask"])
    for name, diff in (("ONNX", onnx_diff), ("TorchScript", pt_diff)):
        if not diff <= MAX_ABS_DIFF:
            raise RuntimeError(f"{name} export of {model_dir} differs from PyTorch by {diff:.2e} > {MAX_ABS_DIFF}")
    print(f"exported {model_dir.name}: ONNX max abs diff {onnx_diff:.1e}, TorchScript {pt_diff:.1e}")
    return {"onnx": onnx_path, "torchscript": pt_path}


def fuse(model_dir: Path, onnx_path: Path, out_path: Path, input_names: list[str], max_length: int) -> float:
    """ONNX Runtime's transformer fusions (Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu)
    applied offline to `onnx_path`, written to `out_path`; returns the max abs diff from PyTorch on real tokens
    and raises above MAX_ABS_DIFF.

    The fused graph uses com.microsoft contrib ops: ONNX Runtime (CPU and CUDA) runs it, TensorRT does not, so
    the gpu target keeps building its plan from the plain export. opt_level 0 keeps the graph provider-neutral
    (ONNX Runtime applies its own hardware-specific optimisations when it opens the session).
    """
    import json

    import onnxruntime as ort
    import torch
    from onnxruntime.transformers.optimizer import optimize_model

    config = json.loads((Path(model_dir) / "config.json").read_text())
    fused = optimize_model(str(onnx_path), model_type="bert", num_heads=int(config["num_attention_heads"]),
                           hidden_size=int(config["hidden_size"]), opt_level=0)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fused.save_model_to_file(str(out_path))
    inputs = _check_inputs(model_dir, input_names, max_length)
    with torch.inference_mode():
        expected = _load(model_dir)(*(torch.from_numpy(inputs[n]) for n in input_names)).numpy()
    session = ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    diff = max_diff_on_real_tokens(expected, session.run(None, inputs)[0], inputs["attention_mask"])
    if not diff <= MAX_ABS_DIFF:
        raise RuntimeError(f"fused ONNX of {model_dir} differs from PyTorch by {diff:.2e} > {MAX_ABS_DIFF}")
    counts = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
    print(f"fused {Path(model_dir).name}: {counts}, max abs diff {diff:.1e}")
    return diff


def mean_pooled(token_embeddings: np.ndarray, mask: np.ndarray, normalize: bool) -> np.ndarray:
    weights = mask[:, :, None].astype(np.float32)
    means = (token_embeddings * weights).sum(1) / np.clip(weights.sum(1), 1e-9, None)
    return means / np.linalg.norm(means, axis=1, keepdims=True) if normalize else means


def export_packed(model_dir: Path, out_path: Path, input_names: list[str], max_length: int, pooled: bool = False,
                  normalize: bool = False, opset: int = 17) -> float:
    """Write the packed encoder (`_load_packed`) to `out_path`; returns its max abs diff from the plain PyTorch
    forward of each sentence alone (on real tokens, or on the pooled embeddings), and raises above MAX_ABS_DIFF."""
    import onnxruntime as ort
    import torch

    inputs = _check_inputs(model_dir, input_names, max_length)
    with torch.inference_mode():
        expected = _load(model_dir)(*(torch.from_numpy(inputs[n]) for n in input_names)).numpy()
    packed, lengths = pack(inputs)
    names = ["input_ids", "position_ids", "segment_ids"] + (["token_type_ids"] if "token_type_ids" in packed else [])
    output = "EMBEDDING" if pooled else "token_embeddings"
    axes = {n: {1: "tokens"} for n in names} | {output: {0: "sentences"} if pooled else {1: "tokens"}}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_load_packed(model_dir, pooled, normalize), tuple(torch.from_numpy(packed[n]) for n in names),
                          str(out_path), input_names=names, output_names=[output], dynamic_axes=axes,
                          opset_version=opset, dynamo=False)
    got = ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"]).run(None, packed)[0]
    if pooled:
        diff = float(np.abs(mean_pooled(expected, inputs["attention_mask"], normalize) - got).max())
    else:
        diff = max_diff_on_real_tokens(expected, unpack(got, lengths, expected.shape[1]), inputs["attention_mask"])
    if not diff <= MAX_ABS_DIFF:
        raise RuntimeError(f"packed ONNX of {model_dir} differs from PyTorch by {diff:.2e} > {MAX_ABS_DIFF}")
    print(f"packed{' and pooled' if pooled else ''} {Path(model_dir).name}: max abs diff {diff:.1e}")
    return diff


def check_openvino(model_dir: Path, onnx_path: Path, input_names: list[str], max_length: int,
                   precision: str, packed: bool = False) -> float:
    """Run `onnx_path` (the plain or, with `packed`, the packed export) with OpenVINO at `precision` (fp32 | bf16)
    on this CPU; returns the smallest cosine between its mean-pooled embeddings and PyTorch's, and raises below
    MIN_EMBEDDING_COSINE. Where the CPU has no native bf16, OpenVINO runs fp32 and the check shows that."""
    import openvino as ov
    import torch

    inputs = _check_inputs(model_dir, input_names, max_length)
    with torch.inference_mode():
        expected = _load(model_dir)(*(torch.from_numpy(inputs[n]) for n in input_names)).numpy()
    core = ov.Core()
    hint = _runner_module("openvino_session").OPENVINO_PRECISION[precision]
    compiled = core.compile_model(core.read_model(str(onnx_path)), "CPU", {"INFERENCE_PRECISION_HINT": hint})
    mask = inputs["attention_mask"]
    if packed:
        feeds, lengths = pack(inputs)
        actual = compiled(feeds)[0]
        if actual.ndim == 3:  # token embeddings; a pooled export gives [sentences, hidden]
            actual = mean_pooled(unpack(actual, lengths, expected.shape[1]), mask, False)
    else:
        actual = mean_pooled(compiled({n: inputs[n] for n in input_names})[0], mask, False)
    pooled = [mean_pooled(expected, mask, False), actual]
    cosine = float(((pooled[0] * pooled[1]).sum(1) / np.linalg.norm(pooled[0], axis=1)
                    / np.linalg.norm(pooled[1], axis=1)).min())
    ran = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # what this CPU runs: bf16 or f32
    if not cosine >= MIN_EMBEDDING_COSINE:
        raise RuntimeError(f"OpenVINO {precision} ({ran}) embeddings of {model_dir} reach cosine {cosine:.6f} "
                           f"< {MIN_EMBEDDING_COSINE} against PyTorch; serve it with encoder_precision=fp32")
    print(f"openvino {precision} ({ran}) {Path(model_dir).name}: min embedding cosine {cosine:.6f}")
    return cosine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args(argv)
    from tritonpack.ensembles.text import SentenceTransformerSource

    source = SentenceTransformerSource.load(args.model_dir)
    export(source.path, args.out_dir, [t.name for t in source.encoder_inputs()], source.max_seq_length,
           args.opset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
