"""The text encoder's artifacts, each a cached producer checked against the PyTorch forward of its source:

- `encoder_onnx`: ONNX taking input_ids, attention_mask[, token_type_ids] (INT64 [batch, seq]) and returning
  token_embeddings (FP32 [batch, seq, hidden]); batch and sequence axes dynamic. What TensorRT and Triton's
  onnxruntime/openvino backends load.
- `encoder_torchscript`: the same as TorchScript (pytorch_libtorch).
- `encoder_fused`: the ONNX with ONNX Runtime's transformer fusions (ONNX Runtime only).
- `encoder_packed`: several sentences as one sequence (models/framework_runner/packing.py), optionally mean-pooling
  inside the graph into a fixed number of sentence slots (the portable runner's encoder).
- `openvino_ir`: an export as OpenVINO IR (`model.xml` + `model.bin`), its weights stored in 16 bits or 32.
- `openvino_check`: the cosine of an export run by OpenVINO at a precision on this CPU, against PyTorch.
- `encoder_reference`: the check texts' tokens and PyTorch embeddings, shipped beside a portable encoder whose
  precision the serving CPU picks: its runner checks itself against them at load (runner_batching.py).

    python -m tritonpack.build.export_text_encoder MODEL_DIR OUT_DIR [--torchscript]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

from tritonpack import CARD_ROOT, contracts
from tritonpack.build import torchscript
from tritonpack.build.text_source import SentenceTransformerSource
from tritonpack.cache import producer
from tritonpack.components import load_model_module
from tritonpack.ensembles.text import ENCODER_WEIGHTS

RUNNER_DIR = CARD_ROOT / "models" / "framework_runner"
OPSET = 17
MAX_ABS_DIFF = 1e-4  # on real (unpadded) tokens, against the PyTorch forward
MIN_EMBEDDING_COSINE = 0.9999  # mean-pooled, against the PyTorch forward, for reduced-precision runtimes
CHECK_TEXTS = [
    "",
    "A short one.",
    "Mixed lengths make padding matter: this sentence is quite a bit longer than the others in the batch.",
    "Ünïcödé, emoji 🚀 and 中文 too.",
    # Short texts: their embedding averages few tokens, so reduced precision shows most there (docs/performance.md,
    # eighteenth round: bf16 on an AVX512_BF16 EPYC missed the floor on "Thank you!" alone among 3,012 short texts,
    # with plainly rounded fp16 weights; forty-ninth: with bf16_faithful_fp16 ones it holds there too)
    "Thank you!", "Thanks!", "OK", "Yes.", "No.", "Hi", "Hello world", "Why?", "Great!", "Sure, why not.",
    "Refund please.", "Not bad at all.", "Good morning", "See you tomorrow.", "I agree.", "Help", "cancel", "price",
    "Where is my order?", "Call me back.", "Love it!", "Too expensive.", "Works fine.", "It broke.", "Happy birthday!",
    "Merci beaucoup", "Danke schön", "¿Qué tal?", "Cool 😎", "404",
]
# Long texts, from 17 tokens to past the model's limit: where a CPU's bf16 misses the floor on short texts only, the
# encoder guards short ones (openvino_session.GUARDED), and these check that it computes the others in bf16 alone.
_REPORT = ("The warehouse in Rotterdam shipped 1,240 pallets in March, up 8% on February, although two deliveries to "
           "Lyon were delayed by a strike at the port. Customers asked mostly about tracking numbers, invoices that "
           "listed the wrong VAT rate, and whether orders placed after 4 p.m. still leave the same day; the answer "
           "is yes for parcels under 30 kg. Next quarter we plan to move returns handling to the new site near "
           "Antwerp, hire six more people for the night shift, and replace the label printers, which jam roughly "
           "once per hundred labels. Energy costs fell slightly after the solar panels went live, but insurance "
           "premiums rose by 12%, so the net effect on the budget is close to zero. Questions about the forecast "
           "should go to the finance team before the board meeting on the 14th; the slides will be shared on "
           "Monday, together with the survey results from the drivers and the updated safety checklist for "
           "forklifts, which now includes a daily brake test and a weekly inspection of the hydraulic hoses.")
CHECK_TEXTS += [(_REPORT + " " + _REPORT)[:chars] for chars in (90, 200, 420, 800, 1100, 2 * len(_REPORT) + 1)]


def _load(model_dir: Path):
    import torch
    from transformers import AutoModel
    from transformers.utils import logging

    logging.disable_progress_bar()  # a build prints one line per artifact, not a bar per weights load
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager").eval()

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state

    return TokenEmbeddings(model).eval()


def _load_packed(model_dir: Path, pooled: bool = False, normalize: bool = False, slots: int = 0):
    """The encoder taking several sentences as one sequence (models/framework_runner/packing.py): attention stays
    inside a sentence (block-diagonal additive mask from `segment_ids`) and `position_ids` restart for each one, so
    every sentence gets exactly its unpacked embeddings. `pooled`: return each sentence's mean over its tokens
    ([sentences, hidden], L2-normalised with `normalize`) instead of the token embeddings ([1, tokens, hidden]).

    `slots` > 0: the pooled output has exactly that many rows, segment i in row i and zeros in rows no segment
    uses, so the graph's shapes depend on the pack's length only: OpenVINO keeps state per internal shape, and a
    row count that varies with every pack grew a serving process without bound (docs/performance.md)."""
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
            rows = torch.arange(slots) if slots else torch.arange(segment_ids.max() + 1)
            members = (segment_ids[0][None, :] == rows[:, None]).to(tokens.dtype)
            means = members @ tokens[0] / members.sum(1, keepdim=True).clamp(min=1.0)
            return torch.nn.functional.normalize(means, dim=1, eps=1e-12) if normalize else means

    return PackedTokenEmbeddings().eval()


@functools.cache
def _runner_module(name: str):
    """A numpy-only module of the portable runner (models/framework_runner/<name>.py), so the build packs and
    configures exactly as the served model does; loaded once."""
    return load_model_module("framework_runner", name)


def pack(inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[int]]:
    """Right-padded rows (input_ids, attention_mask[, token_type_ids]) → one packed row, and each row's length."""
    lengths = [max(int(m.sum()), 1) for m in inputs["attention_mask"]]
    rows = [{n: inputs[n][r, :length] for n in ("input_ids", "token_type_ids") if n in inputs}
            for r, length in enumerate(lengths)]
    return _runner_module("packing").packed_inputs(rows), lengths


def packs(inputs: dict[str, np.ndarray], max_rows: int = 0) -> list[tuple[dict[str, np.ndarray], list[int], list[int]]]:
    """`pack` over the runner's groups of at most `max_rows` rows (one group with 0), with the rows in each: a pooled
    export with sentence slots returns that many rows, so it checks the texts a slot-full at a time."""
    lengths = [max(int(m.sum()), 1) for m in inputs["attention_mask"]]
    groups = _runner_module("packing").pack_groups(lengths, sum(lengths), max_rows)
    return [pack({n: a[group] for n, a in inputs.items()}) + (group,) for group in groups]


def unpack(packed_output: np.ndarray, lengths: list[int], width: int) -> np.ndarray:
    """[1, tokens, hidden] → [rows, width, hidden], each row's tokens first and zeros after."""
    out = np.zeros((len(lengths), width) + packed_output.shape[2:], dtype=packed_output.dtype)
    for r, row in enumerate(_runner_module("packing").unpacked(packed_output, lengths)):
        out[r, :len(row)] = row
    return out


def check_inputs(source: SentenceTransformerSource) -> dict[str, np.ndarray]:
    """The check texts tokenized as the served tokenizer does (right padding), by input name."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    tokenizer.enable_truncation(source.max_seq_length)
    tokenizer.enable_padding(pad_id=0)
    encodings = tokenizer.encode_batch(CHECK_TEXTS)
    arrays = {"input_ids": [e.ids for e in encodings], "attention_mask": [e.attention_mask for e in encodings],
              "token_type_ids": [e.type_ids for e in encodings]}
    return {n: np.array(arrays[n], dtype=np.int64) for n in source.input_names}


def max_diff_on_real_tokens(expected: np.ndarray, actual: np.ndarray, mask: np.ndarray) -> float:
    real = mask.astype(bool)
    return float(np.abs(expected[real] - actual[real]).max())


def _expected(source: SentenceTransformerSource, inputs: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return _load(source.path)(*(torch.from_numpy(inputs[n]) for n in source.input_names)).numpy()


def _check(what: str, source: SentenceTransformerSource, diff: float) -> float:
    if not diff <= MAX_ABS_DIFF:
        raise RuntimeError(f"{what} of {source.path} differs from PyTorch by {diff:.2e} > {MAX_ABS_DIFF}")
    print(f"{what} of {source.path.name}: max abs diff {diff:.1e}")
    return diff


def _ort_session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _ort_run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return _ort_session(path).run(None, feeds)[0]


@producer("text-encoder-onnx", libraries=("torch", "transformers", "onnx"))
def encoder_onnx(out_dir: Path, source: SentenceTransformerSource) -> None:
    """`model.onnx`; raises if it differs from PyTorch."""
    import torch

    names = source.input_names
    inputs = check_inputs(source)
    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "token_embeddings"]}
    with torchscript.quiet_tracing():
        torch.onnx.export(_load(source.path), tuple(torch.from_numpy(inputs[n]) for n in names),
                          str(out_dir / "model.onnx"), input_names=names, output_names=["token_embeddings"],
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    actual = _ort_run(out_dir / "model.onnx", inputs)
    _check("ONNX export", source, max_diff_on_real_tokens(_expected(source, inputs), actual, inputs["attention_mask"]))


def _load_device_portable(model_dir: Path):
    """`_load`'s forward with the additive attention mask made from the inputs' own device. transformers builds it
    from a constant placed on the device the model is on, which a trace then fixes in the graph: a TorchScript traced
    here on the CPU failed on the GPU ("Expected all tensors to be on the same device, … cuda:0 and cpu",
    docs/performance.md, thirty-sixth round). Models without BERT's embeddings/encoder split keep transformers' own
    mask (and `encoder_torchscript` refuses a graph that fixes a device)."""
    import torch

    wrapper = _load(model_dir)
    model = wrapper.encoder
    if not (hasattr(model, "embeddings") and hasattr(model, "encoder")):
        return wrapper

    class DevicePortableTokenEmbeddings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            hidden = self.model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
            blocked = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
            return self.model.encoder(hidden, attention_mask=blocked).last_hidden_state

    return DevicePortableTokenEmbeddings().eval()


def _pooling(encoder, normalize: bool):
    """`encoder` answering each row's mean over its real tokens (then L2-normalised with `normalize`), as
    sentence-transformers' Pooling(mean) [+ Normalize], instead of its token embeddings."""
    import torch

    class MeanPooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            tokens = self.encoder(input_ids, attention_mask, token_type_ids)
            weights = attention_mask.to(tokens.dtype).unsqueeze(-1)
            means = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(means, dim=1) if normalize else means

    return MeanPooled().eval()


@producer("text-encoder-torchscript", libraries=("torch", "transformers"), code=(Path(torchscript.__file__),))
def encoder_torchscript(out_dir: Path, source: SentenceTransformerSource, pooled: bool = False) -> None:
    """`model.pt`, traced with the inputs named like the forward's arguments (pytorch_libtorch's convention); it runs
    on whichever device its inputs are (a graph that fixes one is refused). `pooled`: it answers the sentence
    embedding (`_pooling`) instead of token embeddings, checked against the pooled PyTorch forward."""
    import torch

    inputs = check_inputs(source)
    tensors = tuple(torch.from_numpy(inputs[n]) for n in source.input_names)
    module = _load_device_portable(source.path)
    if pooled:
        module = _pooling(module, source.normalize)
    with torch.no_grad(), torchscript.quiet_tracing():
        traced = torch.jit.trace(module, tensors, strict=False)
    if devices := torchscript.fixed_devices(traced):
        raise RuntimeError(f"TorchScript export of {source.path}: its graph fixes the device {', '.join(devices)}, "
                           f"so it would fail on any other (a GPU); export this model as ONNX instead")
    torchscript.save(traced, out_dir / "model.pt")
    with torch.inference_mode():
        actual = torch.jit.load(str(out_dir / "model.pt"))(*tensors).numpy()
    expected, mask = _expected(source, inputs), inputs["attention_mask"]
    if pooled:
        _check("pooled TorchScript export", source,
               float(np.abs(mean_pooled(expected, mask, source.normalize) - actual).max()))
    else:
        _check("TorchScript export", source, max_diff_on_real_tokens(expected, actual, mask))


@producer("text-encoder-fused", libraries=("onnxruntime",))
def encoder_fused(out_dir: Path, source: SentenceTransformerSource, onnx: Path) -> None:
    """ONNX Runtime's transformer fusions (Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu)
    applied offline to the plain export `onnx`.

    The fused graph uses com.microsoft contrib ops: ONNX Runtime (CPU and CUDA) runs it, TensorRT does not, so
    the gpu target keeps building its plan from the plain export. opt_level 0 keeps the graph provider-neutral
    (ONNX Runtime applies its own hardware-specific optimisations when it opens the session).
    """
    from onnxruntime.transformers.optimizer import optimize_model

    config = json.loads((source.path / "config.json").read_text())
    fused = optimize_model(str(onnx), model_type="bert", num_heads=int(config["num_attention_heads"]),
                           hidden_size=int(config["hidden_size"]), opt_level=0)
    fused.save_model_to_file(str(out_dir / "model.onnx"))
    inputs = check_inputs(source)
    actual = _ort_run(out_dir / "model.onnx", inputs)
    counts = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
    _check(f"fused ONNX {counts}", source,
           max_diff_on_real_tokens(_expected(source, inputs), actual, inputs["attention_mask"]))


def mean_pooled(token_embeddings: np.ndarray, mask: np.ndarray, normalize: bool) -> np.ndarray:
    """The served pooling step's mean (models/shared/pooling.py), so the build checks what serving computes."""
    return _pooling_module().mean_pool(token_embeddings, mask, normalize)


@functools.cache
def _pooling_module():
    return load_model_module("mean_pooling", "pooling")


@producer("text-encoder-packed", libraries=("torch", "transformers", "onnx"), code=(RUNNER_DIR / "packing.py",))
def encoder_packed(out_dir: Path, source: SentenceTransformerSource, pooled: bool, slots: int = 0) -> None:
    """`model.onnx` of the packed encoder (`_load_packed`; `slots` with `pooled`), checked sentence by sentence
    against the plain PyTorch forward of each sentence alone (on real tokens, or on the pooled embeddings)."""
    import torch

    if slots and not pooled:
        raise ValueError("sentence slots are rows of the pooled output: export them with pooled=True")
    inputs = check_inputs(source)
    expected = _expected(source, inputs)
    groups = packs(inputs, slots)
    packed = groups[0][0]
    names = ["input_ids", "position_ids", "segment_ids"] + (["token_type_ids"] if "token_type_ids" in packed else [])
    output = contracts.TEXT.output if pooled else "token_embeddings"
    axes = {n: {1: "tokens"} for n in names} | ({output: {1: "tokens"}} if not pooled else
                                               {} if slots else {output: {0: "sentences"}})
    with torchscript.quiet_tracing():
        torch.onnx.export(_load_packed(source.path, pooled, source.normalize, slots),
                          tuple(torch.from_numpy(packed[n]) for n in names), str(out_dir / "model.onnx"),
                          input_names=names, output_names=[output], dynamic_axes=axes, opset_version=OPSET,
                          dynamo=False)
    session = _ort_session(out_dir / "model.onnx")
    outputs = []
    for feeds, lengths, _ in groups:
        got = session.run(None, feeds)[0]
        if slots and (got.shape[0] != slots or got[len(lengths):].any()):
            raise RuntimeError(f"packed ONNX of {source.path}: expected {slots} rows, zeros after the sentences")
        outputs.append(got[:len(lengths)] if pooled else unpack(got, lengths, expected.shape[1]))
    got = np.concatenate(outputs)
    if pooled:
        diff = float(np.abs(mean_pooled(expected, inputs["attention_mask"], source.normalize) - got).max())
    else:
        diff = max_diff_on_real_tokens(expected, got, inputs["attention_mask"])
    _check(f"packed{' and pooled' if pooled else ''} ONNX", source, diff)


@producer("text-encoder-openvino-ir", libraries=("openvino",))
def openvino_ir(out_dir: Path, model: Path, weights: str) -> None:
    """`model.xml` + `model.bin`: the export `model` (ONNX) as OpenVINO IR, weights stored in fp16 (half the file;
    OpenVINO decompresses them to the inference precision at load) or fp32. What OpenVINO reads fastest, and what
    the openvino_check below must accept before it ships. fp16 weights are stored so that a CPU computing bf16
    rounds each to the bfloat16 it would have rounded the fp32 original to (`bf16_faithful_fp16`)."""
    import openvino as ov

    if weights not in ENCODER_WEIGHTS:
        raise ValueError(f"IR weights are stored as {' or '.join(ENCODER_WEIGHTS)}, not {weights!r}")
    ir = ov.Core().read_model(str(model))
    if weights == "fp32":
        ov.save_model(ir, str(out_dir / "model.xml"), compress_to_fp16=False)
        return
    originals = {op.get_friendly_name(): op.get_data(copy=True) for op in ir.get_ops()
                 if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.f32}
    ov.save_model(ir, str(out_dir / "model.xml"), compress_to_fp16=True)
    _store_fp16_constants_bf16_faithfully(out_dir / "model.xml", originals)


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """The bfloat16 (as uint16 bits) each float32 of `values` rounds to, to nearest, ties to even."""
    bits = np.asarray(values, np.float32).reshape(-1).view(np.uint32).astype(np.uint64)
    half, shift = np.uint64(0x7FFF), np.uint64(16)
    return ((bits + half + ((bits >> shift) & np.uint64(1))) >> shift).astype(np.uint16).reshape(np.shape(values))


def bf16_faithful_fp16(original: np.ndarray) -> np.ndarray:
    """`original` (float32) in fp16, where a CPU computing bfloat16 rounds every value as it would the original.

    Rounding to fp16 and then to bf16 rounds twice: an fp16 value that lands exactly halfway between two bfloat16s
    (its three lowest mantissa bits 100) is then rounded to the even one, which for about one weight in sixteen is not
    the bfloat16 nearest the original. Those values move one fp16 step towards the original, off the tie (fp16's
    error for them: one step instead of half). MiniLM in bf16 on an AVX512_BF16 EPYC: min cosine on the check texts
    0.999888 with plainly rounded fp16 weights, 0.999906 with fp32 weights, 0.999909 with these
    (docs/performance.md, forty-ninth round). fp16 subnormals (|w| < 2^-14) keep their nearest value."""
    nearest = original.astype(np.float16)
    off = _bf16_bits(nearest.astype(np.float32)) != _bf16_bits(original)
    moved = np.nextafter(nearest, np.where(original > nearest, np.float16(np.inf), np.float16(-np.inf)))
    fixed = off & (_bf16_bits(moved.astype(np.float32)) == _bf16_bits(original))
    return np.where(fixed, moved, nearest)


def _store_fp16_constants_bf16_faithfully(xml: Path, originals: dict[str, np.ndarray]) -> None:
    """Rewrite in place the fp16 constants of the IR `xml` as `bf16_faithful_fp16` of the float32 `originals` OpenVINO
    compressed them from (by the original's name; its compressed copy is named `<name>_compressed`)."""
    from xml.etree import ElementTree

    weights = np.fromfile(xml.with_suffix(".bin"), dtype=np.uint8)
    for layer in ElementTree.parse(xml).getroot().iter("layer"):
        data, name = layer.find("data"), layer.get("name").removesuffix("_compressed")
        if layer.get("type") != "Const" or data.get("element_type") != "f16":
            continue
        offset, size = int(data.get("offset")), int(data.get("size"))
        original = originals.get(name, np.empty(0, np.float32)).reshape(-1)
        if not np.array_equal(weights[offset:offset + size].view(np.float16), original.astype(np.float16)):
            raise RuntimeError(f"{xml}: fp16 constant {layer.get('name')!r} is not a float32 constant {name!r} rounded")
        weights[offset:offset + size] = bf16_faithful_fp16(original).view(np.uint8)
    weights.tofile(xml.with_suffix(".bin"))


def _cpu_signature() -> dict[str, str]:
    """This CPU and OpenVINO as far as the check's result depends on them (whether bf16 is native, how it rounds)."""
    return {"cpu": _runner_module("openvino_session").cpu_signature()}


@producer("text-encoder-openvino-check", libraries=("openvino",),
          code=(RUNNER_DIR / "openvino_session.py", RUNNER_DIR / "packing.py"), environment=_cpu_signature)
def openvino_check(out_dir: Path, source: SentenceTransformerSource, model: Path, precision: str, packed: bool) -> None:
    """Run the plain or packed export `model` (ONNX, or IR with its weights in 16 or 32 bits) with the runner's OpenVINO
    session at `precision` (fp32 | bf16) on this CPU and compare its mean-pooled embeddings with PyTorch's. Where this
    CPU runs bf16 below MIN_EMBEDDING_COSINE, the served encoder reopens at the precision the session names (bf16 with
    cancelling short sentences guarded, bf16 up to the middle layer, then fp32: it checks itself at load against
    `reference.npz`), so those are checked in turn, packed as the runner packs for them. Writes what this CPU would
    serve and its smallest cosine to `check.json` (`serves`: the precision it held at) and raises when that is below
    the floor. Where the CPU has no native bf16, OpenVINO runs fp32 and the check says so."""
    inputs = check_inputs(source)
    reference = mean_pooled(_expected(source, inputs), inputs["attention_mask"], False)
    cosine, ran, fallback = _openvino_cosine(model, precision, inputs, reference, packed)
    below, serving, described = {}, precision, None  # what ran below the floor → its min cosine; what is served
    while not cosine >= MIN_EMBEDDING_COSINE and fallback:
        below[ran], (serving, described) = cosine, fallback
        cosine, ran, fallback = _openvino_cosine(model, serving, inputs, reference, packed)
    stored = _stored_weights(Path(model))
    if not cosine >= MIN_EMBEDDING_COSINE:
        raise RuntimeError(f"OpenVINO {precision} ({ran}) embeddings of {source.path} with {stored} weights reach "
                           f"cosine {cosine:.6f} < {MIN_EMBEDDING_COSINE} against PyTorch; serve it with "
                           f"encoder_precision=fp32{' and encoder_weights=fp32' if stored == 'fp16' else ''}")
    head = f"openvino {precision} ({next(iter(below), ran)}), {stored} weights, {source.path.name}: min embedding"
    if not below:
        print(f"{head} cosine {cosine:.6f}")
    else:
        print(f"{head} cosine {', then '.join(f'{c:.6f} ({r})' for r, c in below.items())} < {MIN_EMBEDDING_COSINE} "
              f"on this CPU, so the encoder serves {described} here (min cosine {cosine:.6f}, {ran})")
    (out_dir / "check.json").write_text(json.dumps({"precision": precision, "ran": ran, "weights": stored,
                                                    "min_cosine": cosine, "below_floor": below, "serves": serving}))


def _openvino_cosine(model: Path, precision: str, inputs: dict[str, np.ndarray], reference: np.ndarray,
                     packed: bool) -> tuple[float, str, tuple[str, str] | None]:
    """The smallest cosine between `reference` and `model`'s mean-pooled embeddings of `inputs` (`openvino_embeddings`);
    what this CPU computed (bf16, f32, bf16+f32); and the precision the session falls back to below the floor (None
    where it computed f32)."""
    actual, session = openvino_embeddings(model, precision, inputs, packed)
    cosine = float(((reference * actual).sum(1) / np.linalg.norm(reference, axis=1)
                    / np.linalg.norm(actual, axis=1)).min())
    return cosine, session.computes, session.fallback


def openvino_embeddings(model: Path, precision: str, inputs: dict[str, np.ndarray], packed: bool):
    """(`model`'s mean-pooled embeddings of `inputs`, not normalised, run by the runner's OpenVINO session at
    `precision` as it is served; that session)."""
    import openvino as ov

    mask = inputs["attention_mask"]
    if packed:
        # as the packing runner opens it
        session = _runner_module("openvino_session").open_session(str(model), {"precision": precision,
                                                                               "max_pack_tokens": str(mask.size)})
        rows = ov.Core().read_model(str(model)).output(0).get_partial_shape()  # [slots, hidden] with sentence slots
        slots = rows[0].get_length() if len(rows) == 2 and rows[0].is_static else 0
        pieces, order = [], []
        for feeds, lengths, group in packs(inputs, slots):
            got = next(iter(session(feeds, len(lengths)).values()))  # token embeddings [1, tokens, hidden], or rows
            pieces.append(unpack(got, lengths, mask.shape[1]) if got.ndim == 3 else got[:len(lengths)])
            order += group
        actual = np.concatenate(pieces)[np.argsort(order)]
        if actual.ndim == 3:
            actual = mean_pooled(actual, mask, False)
    else:
        session = _runner_module("openvino_session").open_session(str(model), {"precision": precision})
        actual = mean_pooled(next(iter(session(inputs).values())), mask, False)
    return actual, session


@producer("text-encoder-reference", libraries=("torch", "transformers", "tokenizers"))
def encoder_reference(out_dir: Path, source: SentenceTransformerSource) -> None:
    """`reference.npz`: the check texts as the served tokenizer gives them (right-padded `input_ids`,
    `attention_mask`[, `token_type_ids`]), their mean-pooled, L2-normalised PyTorch embeddings (`embedding`) and the
    floor (`min_cosine`) the runner must reach on them wherever it is loaded."""
    inputs = check_inputs(source)
    embedding = mean_pooled(_expected(source, inputs), inputs["attention_mask"], normalize=True)
    np.savez(out_dir / "reference.npz", **inputs, embedding=embedding.astype(np.float32),
             min_cosine=np.float64(MIN_EMBEDDING_COSINE))


def _stored_weights(model: Path) -> str:
    """fp16 when an IR stores its weights compressed (f16 constants decompressed at load), else fp32."""
    if model.suffix != ".xml":
        return "fp32"
    return "fp16" if 'element_type="f16"' in model.read_text() else "fp32"


def main(argv: list[str] | None = None) -> int:
    from tritonpack.cli import Parser

    parser = Parser(prog="python -m tritonpack.build.export_text_encoder", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--torchscript", action="store_true", help="write model.pt instead of model.onnx")
    args = parser.parse_args(argv)
    source = SentenceTransformerSource.load(args.model_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (encoder_torchscript if args.torchscript else encoder_onnx)(args.out_dir, source=source)
    return 0


if __name__ == "__main__":
    from tritonpack.cli import run_script

    sys.exit(run_script(main))
