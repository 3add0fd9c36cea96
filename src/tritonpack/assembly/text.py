"""A text recipe rendered for a target: tokenizer (python) → encoder → mean pooling (python), or tokenizer → encoder
when the encoder pools itself. Artifacts come from `build/` through the cache; nothing is exported that is not used.
"""

from __future__ import annotations

from dataclasses import replace

from tritonpack import contracts
from tritonpack.build.build_tensorrt import ShapeProfile, require_tensorrt, tensorrt_plan
from tritonpack.build.export_text_encoder import (
    encoder_fused,
    encoder_onnx,
    encoder_packed,
    encoder_reference,
    encoder_torchscript,
    openvino_check,
    openvino_ir,
)
from tritonpack.build.text_source import SentenceTransformerSource
from tritonpack.cache import ArtifactCache
from tritonpack.components import (
    TOKENIZER_FILENAME,
    Artifact,
    ModelFolder,
    StepSettings,
    framework_model,
    given_plans,
    python_model,
    reading_text,
)
from tritonpack.ensembles.text import TextRecipe, TextServing
from tritonpack.errors import SpecError
from tritonpack.spec import EnsembleStep, InstanceGroup, ModelSpec, Tensor

TOKEN_EMBEDDINGS = "token_embeddings"


def assemble(recipe: TextRecipe, request, cache: ArtifactCache) -> list[ModelFolder]:
    source = SentenceTransformerSource.resolve(request.model)
    serving = serving_for(recipe.serving[request.target], request.serving, source)
    fmt = recipe.encoder[request.target]
    if fmt == "tensorrt_plan" and request.plans:
        artifact = given_plans(dict(request.plans))
    else:
        artifact = encoder_artifact(fmt, request.target, source, serving, request.fp16, cache)
    outputs = (source.embedding_output(),) if serving.encoder_pooling else source.encoder_outputs()
    encoder = framework_model(
        f"{recipe.name}_encoder", artifact, request.target, source.encoder_inputs(), outputs,
        StepSettings(serving.max_batch_size, serving.batching(), serving.encoder_instances, serving.encoder_threads,
                     serving.encoder_pack_tokens, serving.encoder_pack_rows,
                     index_rows=tuple(source.index_rows().items())),
    )
    if serving.encoder_tokenizes:  # portable only: it needs the packed export, which only the portable runner feeds
        encoder = reading_text(encoder, contracts.text_input(), source.path / TOKENIZER_FILENAME,
                               tokenizer_parameters(source, serving), serving.dynamic_batching)
    return text_ensemble(recipe.name, source, encoder, serving, request.io_names or contracts.TEXT)


def serving_for(recipe_serving: TextServing, overrides, source: SentenceTransformerSource) -> TextServing:
    """The recipe's serving with packs at least as long as the model reads, then the user's overrides. A pack
    shorter than the model's `max_seq_length` would refuse every text between the two as the client's mistake."""
    if 0 < recipe_serving.encoder_pack_tokens < source.max_seq_length:
        recipe_serving = replace(recipe_serving, encoder_pack_tokens=source.max_seq_length)
    serving = recipe_serving.with_overrides(overrides)
    if 0 < serving.encoder_pack_tokens < source.max_seq_length:
        raise SpecError(f"encoder_pack_tokens {serving.encoder_pack_tokens} is shorter than the model's max_seq_length "
                        f"{source.max_seq_length}: texts between would be refused; give --serving "
                        f"encoder_pack_tokens={source.max_seq_length} or leave it out")
    return serving


def tokenizer_parameters(source: SentenceTransformerSource, serving: TextServing) -> dict[str, str]:
    """What the python code that tokenizes reads from its config (models/shared/tokenize_text.py)."""
    return {"max_sequence_length": str(source.max_seq_length), "pad_token": source.pad_token,
            "max_text_bytes": str(serving.max_text_bytes)}


def encoder_artifact(fmt: str, target: str, source: SentenceTransformerSource, serving: TextServing, fp16: bool,
                     cache: ArtifactCache) -> Artifact:
    """The encoder file for a target: `fmt` from the recipe, refined by the serving settings (runtime, precision,
    packing, pooling, stored weights). The portable runner reads OpenVINO's IR (half the size with fp16 weights,
    read faster than ONNX); Triton's openvino backend on `cpu` gets the ONNX file."""
    if fmt == "torchscript":
        if serving.encoder_pack_tokens:
            raise SpecError("a TorchScript encoder runs unpacked: encoder_pack_tokens is for ONNX encoders")
        return Artifact("torchscript", cache.get(encoder_torchscript, source=source, pooled=serving.encoder_pooling)
                        / "model.pt")
    if fmt == "tensorrt_plan":
        if serving.encoder_runtime != "onnxruntime" or serving.encoder_pack_tokens or serving.encoder_pooling:
            raise SpecError("the gpu target runs its encoder as a TensorRT plan: encoder_runtime, "
                            "encoder_pack_tokens and encoder_pooling are for cpu/portable")
        require_tensorrt()  # before the export it would build from
        onnx = cache.get(encoder_onnx, source=source) / "model.onnx"
        plan = cache.get(tensorrt_plan, onnx=onnx, profiles=text_profiles(source, serving.max_batch_size), fp16=fp16)
        return Artifact("tensorrt_plan", plan / "model.plan")
    if serving.encoder_pooling and not serving.encoder_pack_tokens:
        raise SpecError("encoder_pooling of an ONNX encoder needs encoder_pack_tokens > 0 (the packed export pools)")
    packed = serving.encoder_pack_tokens > 0
    if packed:
        onnx = cache.get(encoder_packed, source=source, pooled=serving.encoder_pooling,
                         slots=serving.encoder_pack_rows) / "model.onnx"
    else:
        onnx = cache.get(encoder_onnx, source=source) / "model.onnx"
    if serving.encoder_runtime == "openvino":
        if target == "portable":
            model, framework = cache.get(openvino_ir, model=onnx, weights=serving.encoder_weights) / "model.xml", \
                "openvino_ir"
        elif serving.encoder_weights != "fp32":
            raise SpecError(f"encoder_weights {serving.encoder_weights}: Triton's openvino backend on {target} "
                            f"reads the ONNX export, whose weights are fp32")
        else:
            model, framework = onnx, "openvino"
        cache.get(openvino_check, source=source, model=model, precision=serving.encoder_precision, packed=packed)
        if target != "portable":
            return Artifact(framework, model, serving.encoder_precision, packed=packed)
        # The CPU that serves it picks bf16 or f32, not this one: the runner checks its embeddings again at load.
        return Artifact(framework, model, serving.encoder_precision, packed=packed,
                        reference=cache.get(encoder_reference, source=source) / "reference.npz")
    if packed:
        return Artifact("onnx", onnx, packed=True)
    # ONNX Runtime runs the fused graph: 1.15× served throughput measured (docs/performance.md)
    return Artifact("onnx", cache.get(encoder_fused, source=source, onnx=onnx) / "model.onnx")


def text_profiles(source: SentenceTransformerSource, max_batch_size: int) -> tuple[ShapeProfile, ...]:
    """TensorRT profile over batch 1..max_batch_size and sequence 1..max_seq_length, tuned for short sentences."""
    seq = source.max_seq_length
    return tuple(ShapeProfile(name, (1, 1), (max(1, max_batch_size // 2), min(128, seq)), (max_batch_size, seq))
                 for name in source.input_names)


def text_ensemble(name: str, source: SentenceTransformerSource, encoder: ModelFolder, serving: TextServing,
                  io: contracts.IoNames = contracts.TEXT) -> list[ModelFolder]:
    """[ensemble, tokenizer, encoder(, pooling)], or [ensemble, encoder] where the encoder reads the text; the
    ensemble's public tensors are named by `io`."""
    embedding = source.embedding_output()
    text = contracts.text_input()
    if encoder.spec.inputs == (text,):
        step = EnsembleStep(encoder.spec.name, {text.name: io.input}, {embedding.name: io.output})
        return [_ensemble(name, source, serving, io, (step,)), encoder]
    batching = serving.batching()
    token_tensors = source.encoder_inputs()
    tokenizer = python_model(
        ModelSpec(
            name=f"{name}_tokenizer", backend="python", max_batch_size=serving.max_batch_size,
            inputs=(text,), outputs=token_tensors,
            instance_group=(InstanceGroup("KIND_CPU", serving.tokenizer_instances),),
            dynamic_batching=batching if serving.tokenizer_batching else None,
            parameters=tokenizer_parameters(source, serving),
        ),
        "tokenizer",
        {f"1/{TOKENIZER_FILENAME}": source.path / TOKENIZER_FILENAME},
    )
    token_map = {t.name: t.name for t in token_tensors}
    steps = [EnsembleStep(tokenizer.spec.name, {text.name: io.input}, token_map)]
    models = [tokenizer, encoder]
    if serving.encoder_pooling:
        steps.append(EnsembleStep(encoder.spec.name, token_map, {encoder.spec.outputs[0].name: io.output}))
    else:
        pooling = python_model(
            ModelSpec(
                name=f"{name}_pooling", backend="python", max_batch_size=serving.max_batch_size,
                inputs=(Tensor(TOKEN_EMBEDDINGS, "TYPE_FP32", (-1, source.hidden_size), allow_ragged_batch=True),
                        Tensor("attention_mask", "TYPE_INT64", (-1,), allow_ragged_batch=True)),
                outputs=(embedding,), instance_group=(InstanceGroup("KIND_CPU", serving.pooling_instances),),
                dynamic_batching=serving.pooling_batching(),
                parameters={"normalize": "true" if source.normalize else "false"},
            ),
            "mean_pooling",
        )
        pooling_inputs = {TOKEN_EMBEDDINGS: TOKEN_EMBEDDINGS, "attention_mask": "attention_mask"}
        steps += [EnsembleStep(encoder.spec.name, token_map, {encoder.spec.outputs[0].name: TOKEN_EMBEDDINGS}),
                  EnsembleStep(pooling.spec.name, pooling_inputs, {embedding.name: io.output})]
        models.append(pooling)
    return [_ensemble(name, source, serving, io, tuple(steps)), *models]


def _ensemble(name: str, source: SentenceTransformerSource, serving: TextServing, io: contracts.IoNames,
              steps: tuple[EnsembleStep, ...]) -> ModelFolder:
    return ModelFolder(ModelSpec(
        name=name, platform="ensemble", max_batch_size=serving.max_batch_size,
        inputs=(contracts.text_input(io.input),), outputs=(source.embedding_output(io.output),), ensemble_steps=steps,
    ))
