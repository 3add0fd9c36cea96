"""Sentence-embedding recipes: tokenizer (python) → encoder → mean pooling (python), `TEXT` → `EMBEDDING`.

A recipe only describes: which artifact format the encoder runs in on each target, and how each target serves
(`TextServing`). `tritonpack.assembly.text` renders it into model folders; `build/` produces the artifacts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tritonpack.backends import FRAMEWORKS
from tritonpack.errors import SpecError
from tritonpack.spec import DynamicBatching, override_fields

MAX_TEXT_BYTES = 65536  # one TEXT element; longer input is rejected before tokenization
ENCODER_RUNTIMES = ("onnxruntime", "openvino")
ENCODER_WEIGHTS = ("fp32", "fp16")
ENCODER_PRECISIONS = ("fp32", "bf16")  # bf16: matrix products in bfloat16 where the CPU has it natively


@dataclass(frozen=True)
class TextServing:
    """Batching and instances for the python steps; chosen per target (see README, "Batching")."""

    max_batch_size: int = 64
    tokenizer_instances: int = 1
    pooling_instances: int = 1
    max_queue_delay_microseconds: int = 2000
    # The pooling step gets an encoder batch's rows at once: a short delay keeps that batch whole, where the encoder's
    # made each request wait for the next batch, one encoder call later (2 ms a request; performance.md, fortieth round)
    pooling_queue_delay_microseconds: int = 100
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
    # mean pooling (+ normalisation) inside the encoder graph, so the ensemble has no pooling step: the packed ONNX
    # export (with encoder_pack_tokens), or the TorchScript export
    encoder_pooling: bool = False
    # with pooling: the pooled export's fixed number of sentence slots, which is also the most sentences a pack
    # takes (OpenVINO's memory stays flat when the graph's row count does not vary); 0: one row per sentence
    encoder_pack_rows: int = 0
    # portable OpenVINO encoder: its IR stores weights in fp16 (half the tarball) or fp32; the build's cosine check
    # decides whether fp16 is good enough
    encoder_weights: str = "fp32"
    # portable, with pooling: the encoder reads TEXT and tokenizes each request itself, batching requests on its own
    # instead of through Triton's batcher: one python process and one hop fewer, but Triton never answers the
    # requests it has queued if its stub dies (models/framework_runner/text_requests.py)
    encoder_tokenizes: bool = False

    def __post_init__(self) -> None:
        for setting in ("max_batch_size", "max_text_bytes"):
            if getattr(self, setting) < 1:
                raise SpecError(f"TextServing: {setting} must be at least 1, got {getattr(self, setting)}")
        if min(self.tokenizer_instances, self.pooling_instances, self.encoder_instances) < 1:
            raise SpecError(f"TextServing: tokenizer_instances, pooling_instances and encoder_instances must be at "
                            f"least 1, got {self.tokenizer_instances}, {self.pooling_instances}, "
                            f"{self.encoder_instances}")
        if min(self.encoder_threads, self.max_queue_delay_microseconds, self.pooling_queue_delay_microseconds,
               *self.preferred_batch_size) < 0:
            raise SpecError(f"TextServing: encoder_threads (0: the library's default), max_queue_delay_microseconds, "
                            f"pooling_queue_delay_microseconds and preferred_batch_size cannot be negative, got "
                            f"{self.encoder_threads}, {self.max_queue_delay_microseconds}, "
                            f"{self.pooling_queue_delay_microseconds}, {self.preferred_batch_size}")
        if max(self.preferred_batch_size, default=0) > self.max_batch_size:
            raise SpecError(f"TextServing: preferred_batch_size {self.preferred_batch_size} exceeds max_batch_size "
                            f"{self.max_batch_size} (Triton refuses the model)")
        if self.encoder_runtime not in ENCODER_RUNTIMES:
            raise SpecError(f"TextServing: encoder_runtime must be one of {', '.join(ENCODER_RUNTIMES)}, "
                            f"got {self.encoder_runtime!r}")
        if self.encoder_pack_tokens < 0:
            raise SpecError(f"TextServing: encoder_pack_tokens must be 0 (no packing) or positive, got "
                            f"{self.encoder_pack_tokens}")
        if self.encoder_precision not in ENCODER_PRECISIONS:  # fp16 raised a KeyError deep in the encoder's check
            raise SpecError(f"TextServing: encoder_precision must be one of {', '.join(ENCODER_PRECISIONS)}, "
                            f"got {self.encoder_precision!r}")
        if self.encoder_precision != "fp32" and self.encoder_runtime != "openvino":
            raise SpecError(f"TextServing: encoder_precision {self.encoder_precision} needs encoder_runtime=openvino")
        if self.encoder_pack_rows < 0 or (self.encoder_pack_rows and not self.encoder_pooling):
            raise SpecError(f"TextServing: encoder_pack_rows are the pooled export's sentence slots: 0, or positive "
                            f"with encoder_pooling, got {self.encoder_pack_rows}")
        if self.encoder_weights not in ENCODER_WEIGHTS:
            raise SpecError(f"TextServing: encoder_weights must be one of {', '.join(ENCODER_WEIGHTS)}, "
                            f"got {self.encoder_weights!r}")
        if self.encoder_tokenizes and not self.encoder_pooling:
            raise SpecError("TextServing: encoder_tokenizes needs encoder_pooling (the encoder's answer is then the "
                            "embedding); add --serving encoder_tokenizes=false")
        if self.encoder_tokenizes and not self.encoder_pack_tokens:
            raise SpecError("TextServing: encoder_tokenizes needs the packed export (encoder_pack_tokens > 0); add "
                            "--serving encoder_tokenizes=false")
        if self.encoder_weights != "fp32" and self.encoder_runtime != "openvino":
            raise SpecError(f"TextServing: encoder_weights {self.encoder_weights} needs encoder_runtime=openvino")

    def with_overrides(self, overrides) -> TextServing:
        """`(("dynamic_batching", "false"), ("encoder_instances", "2"))` (strings, as from the command line)."""
        return override_fields(self, overrides)

    def batching(self) -> DynamicBatching | None:
        if not self.dynamic_batching:
            return None
        return DynamicBatching(preferred_batch_size=self.preferred_batch_size,
                               max_queue_delay_microseconds=self.max_queue_delay_microseconds)

    def pooling_batching(self) -> DynamicBatching | None:
        if not self.dynamic_batching:
            return None
        return DynamicBatching(max_queue_delay_microseconds=self.pooling_queue_delay_microseconds)


@dataclass(frozen=True)
class TextRecipe:
    """`encoder`: target → the encoder's artifact format (a `tritonpack.backends.FRAMEWORKS` key: onnx,
    torchscript, tensorrt_plan); `serving`: target → how that target serves. Both name the same targets."""

    name: str
    encoder: Mapping[str, str]
    serving: Mapping[str, TextServing]
    # serving overrides (as `--serving` takes them) that served `portable` faster where its encoder computes on a
    # GPU; the build names them on a machine with one, since a repository cannot know where it will be served
    portable_on_gpu: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoder", MappingProxyType(dict(self.encoder)))
        object.__setattr__(self, "serving", MappingProxyType(dict(self.serving)))
        if set(self.encoder) != set(self.serving):
            raise SpecError(f"recipe {self.name}: encoder and serving name different targets")
        unknown = sorted(set(self.encoder.values()) - set(FRAMEWORKS))
        if unknown:
            raise SpecError(f"recipe {self.name}: unknown encoder formats {unknown}")
        if self.portable_on_gpu:
            self.serving["portable"].with_overrides(self.portable_on_gpu)  # names and values it can take

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.serving)
