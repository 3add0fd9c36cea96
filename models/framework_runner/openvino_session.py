"""Run an ONNX file or an OpenVINO IR with OpenVINO on the CPU (`precision` bf16, fp32, `mixed` or `bf16-guarded`).

`mixed` splits a transformer after its middle layer: the first half computes bf16, the rest f32, as two compiled
models chained per call. Where a CPU's bf16 misses the embedding floor on short texts, that holds it with a margin
at 1.2-1.3x the speed of f32 (an AVX512_BF16 EPYC with plainly rounded fp16 weights: 0.999888 in bf16, 0.999965
mixed; docs/performance.md, eighteenth round). bf16 misses it only on short sentences whose token states nearly
cancel in their mean (`cancelling_sentences`): `bf16-guarded` runs every call in bf16 and those sentences' second
half again in f32, from the bf16 middle state (a packed, pooled export; the caller says how many of a pack's
segments are sentences). A session names the precision to reopen at when its embeddings miss the floor
(`fallback`): bf16 → bf16-guarded → mixed → fp32, which the runner's load-time check (through `reopened`) and the
build's check follow. A packing runner's bf16 compile carries the guard's outputs from the start, so its fall-back
to bf16-guarded keeps that compile and adds only the f32 second half.

One compiled model (two chained, for `mixed`; a second half beside it, for `bf16-guarded`) serves the whole process,
with every CPU this process may run on (`os.sched_getaffinity`, fewer where its cgroup's CPU quota is smaller:
`cpu_quota`; `threads` > 0 takes fewer): one OpenVINO stream (and infer request) per CPUS_PER_STREAM CPUs, at most
MAX_STREAMS, the threads shared out among them. `map` runs several inputs at once, one per idle request, so a runner
that hands it a batch as several packs keeps every stream busy from one process. The weights are held once, where
one process per core held them once per process (docs/performance.md: on 2 CPUs one stream of 2 threads used 6 %
less CPU per sentence than two single-threaded processes, and 13 % less than two streams, at less than half the
memory), and in 16 bits where the file stores them so (`keep_weights_16bit`). The process maps an IR's weights file
itself (`WeightsFile`), so that once every input shape has run (`warmed`) it can hand back the pages of the matrix
weights, which the plugin then holds in layouts of its own, and once the model is idle (`unmap_file_pages`) the
pages its calls mapped since: the embedding rows their tokens read.
"""

from __future__ import annotations

import mmap
import os
import queue
import re
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from cpu_quota import cpu_fields, cpu_limit
from packing import pack_groups
from resident_memory import mapping_kb

# OpenVINO's oneTBB opens its hwloc binding with RTLD_DEEPBIND, so under another malloc preloaded into the process
# (jemalloc or tcmalloc: Triton's release notes suggest LD_PRELOAD of either against heap growth) hwloc frees with
# glibc what libc allocated with the preloaded one, and the stub aborts as the CPU plugin loads. This switch only
# drops the deep binding (oneTBB's `dynamic_link`); it is read when TBB loads that library, after this import.
os.environ.setdefault("TBB_ENABLE_SANITIZERS", "1")
OPENVINO_PRECISION = {"fp32": "f32", "bf16": "bf16"}
MIXED = "mixed"  # bf16 up to the middle layer, f32 after
GUARDED = "bf16-guarded"  # bf16, the second half again in f32 for cancelling short sentences
# Where bf16 misses the floor, it misses it on sentences of a few tokens whose final token states nearly cancel in
# their mean: |mean of the states| / mean |state| ("Thank you!" 0.43, short texts' median 0.70; sentences of 17
# tokens or more keep the floor whatever theirs). On the AMX Xeon family 6 model 167, 10,430 held-out short texts
# and the bench's held-out mix: 4.9 % of the short ones below GUARD_RATIO, every text below 0.9999 among them, min
# cosine 0.999935 of the others (docs/performance.md, seventieth round).
GUARD_TOKENS = 16
GUARD_RATIO = 0.60
# Guarded sentences run again in packs of the first of these lengths they fit: two more input shapes for the f32
# second half, and a lone short sentence pays for 16 tokens, not 64 (AMX Xeon family 6 model 167: 1.35 against
# 2.98 ms; docs/performance.md, seventieth round)
GUARD_PACK_TOKENS = (16, 64)
# A session below the embedding floor is reopened at the next precision: (its name, what it computes)
FALLBACK = {"bf16": (GUARDED, f"bf16, and the second half again in fp32 for sentences of at most {GUARD_TOKENS} "
                              f"tokens whose token states nearly cancel"),
            GUARDED: (MIXED, "bf16 up to the middle layer and fp32 after"), MIXED: ("fp32", "fp32")}
PRECISIONS = (*OPENVINO_PRECISION, GUARDED, MIXED)
# The CPU flags OpenVINO's CPU plugin picks its kernels (and so its bf16 and fp16 rounding) by
SIGNATURE_FLAGS = re.compile(r"(avx|amx|fma|f16c|sse4)\w*")
HIDDEN = "hidden_state"  # what a split model's first half hands to its second
CPUS_PER_STREAM = 4  # a stream's threads share each pack's matrix products; more streams run more packs at once
MAX_STREAMS = 4  # each stream keeps its own state per input shape (~15-35 MB on 2 CPUs, docs/performance.md)


def cpu_signature() -> str:
    """What a precision check's result depends on besides the model: this CPU's vendor, family/model/stepping and
    the instruction sets OpenVINO dispatches on, and OpenVINO's version."""
    import openvino as ov

    fields = cpu_fields()
    flags = sorted(f for f in fields.get("flags", "").split() if SIGNATURE_FLAGS.fullmatch(f))
    return (f"{fields.get('vendor_id', '?')} {fields.get('cpu family', '?')}/{fields.get('model', '?')}/"
            f"{fields.get('stepping', '?')} {','.join(flags)} openvino {ov.get_version()}")


def precision_problem(params: dict[str, str]) -> str | None:
    """What is wrong with the `precision` parameter, where it names no precision a session can open at."""
    precision = params.get("precision", "fp32")
    if precision not in PRECISIONS:
        return f"{precision!r} is not one of {', '.join(PRECISIONS)}"
    return None


def stream_layout(cpus: int, threads: int = 0, streams: int = 0) -> tuple[int, int]:
    """(streams, threads in all) for a process that may use `cpus` CPUs; `threads` > 0 caps the threads,
    `streams` > 0 sets the streams (the threads are shared out among them)."""
    threads = min(threads, cpus) if threads else cpus
    return min(streams or max(1, min(threads // CPUS_PER_STREAM, MAX_STREAMS)), threads), threads


def keep_weights_16bit(model) -> None:
    """Have OpenVINO's CPU plugin keep `model`'s fp16 matrix weights in 16 bits where it computes f32.

    The plugin widens fp16 FullyConnected weights inside its f32 kernels only in models it takes for LLMs (one
    with a ScaledDotProductAttention and a state variable); any other model gets them widened to f32 at the first
    inference, once per weight layout (two on AVX2, for short and for long packs). A state variable written from
    an attention over one 2×8 block makes the model qualify; no output depends on it. MiniLM: −40 MB per loaded
    model, the same embeddings bit for bit, the same speed (docs/performance.md, tenth round)."""
    import openvino as ov
    import openvino.opset13 as ops
    from openvino.op.util import Variable, VariableInfo

    block = ops.constant(np.zeros((1, 1, 2, 8), np.float32))
    info = VariableInfo()
    info.data_shape, info.data_type, info.variable_id = ov.PartialShape([1, 1, 2, 8]), ov.Type.f32, "weights_16bit"
    variable = Variable(info)
    model.add_variables([variable])
    model.add_sinks([ops.assign(ops.scaled_dot_product_attention(block, block, block, causal=False), variable)])


class WeightsFile:
    """An IR's weights file (`model.bin`) mapped by this process, for OpenVINO to read its constants from in place,
    as it does when it maps the file itself. OpenVINO's CPU plugin copies the matrix weights into layouts of its own
    at the first inference of each shape regime and never reads them from the file again: `release` hands those
    pages back to the kernel, both this process's mapping and the page cache (MiniLM: -20 MB per loaded model,
    docs/performance.md, twelfth round). Nothing can be lost: a later read faults a page in from the file again, and
    pages this process has written (private copies; OpenVINO does not write its constants) are never dropped."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_RDONLY)  # kept: the page cache is advised through it (the path may go)
        weakref.finalize(self, os.close, self._fd)
        # A copy-on-write mapping: OpenVINO takes only writable arrays into a shared-memory tensor.
        self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self._address = self.array.__array_interface__["data"][0]

    def tensor(self):
        import openvino as ov

        return ov.Tensor(self.array, shared_memory=True)

    def matrix_weights(self, model) -> list[tuple[int, int]]:
        """(offset, bytes) in this file of every constant of `model` that only MatMuls read (through a Convert where
        it is stored in 16 bits), adjacent ones merged."""
        spans = []
        for op in model.get_ops():
            if op.get_type_name() != "Constant":
                continue
            readers = [r for u in _readers(op) for r in (_readers(u) if u.get_type_name() == "Convert" else [u])]
            if not readers or any(r.get_type_name() != "MatMul" for r in readers):
                continue
            start = np.asarray(op.data).__array_interface__["data"][0] - self._address  # a view into the mapping
            if 0 <= start < self.array.nbytes:
                spans.append((start, start + op.get_byte_size()))
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return [(start, end - start) for start, end in merged]

    def release(self, spans: list[tuple[int, int]]) -> int:
        """Drop the whole pages inside `spans` from this mapping and from the page cache; the bytes dropped (0 when
        this process has written into the mapping)."""
        if self._written():
            return 0
        page, dropped = mmap.PAGESIZE, 0
        for start, size in spans:
            low, high = -(-start // page) * page, (start + size) // page * page
            if high > low:
                self._map.madvise(mmap.MADV_DONTNEED, low, high - low)
                os.posix_fadvise(self._fd, low, high - low, os.POSIX_FADV_DONTNEED)
                dropped += high - low
        return dropped

    def unmap(self) -> bool:
        """Unmap every page of the file from this process, keeping them in the page cache: a later read maps its page
        back at a minor fault. False (nothing unmapped) when this process has written into the mapping."""
        if self._written():
            return False
        self._map.madvise(mmap.MADV_DONTNEED)
        return True

    def _written(self) -> bool:
        return mapping_kb(self._address, "Anonymous") > 0  # kB of private copies of pages this process wrote


def _readers(node) -> list:
    return [target.get_node() for output in node.outputs() for target in output.get_target_inputs()]


def read_model(core, path: str, precision: str, weights: WeightsFile | None = None):
    """The model at `path` as this process compiles it for OpenVINO `precision` (f32 | bf16) on this CPU; an IR's
    constants are read from `weights` when given, else from a mapping OpenVINO makes."""
    model = _read(core, path, weights)
    if precision == "f32" or not _native_bf16(core):
        _keep_f16_weights_16bit(model)
    return model


def split_in_the_middle(core, path: str, weights: WeightsFile | None = None):
    """(first half, second half) of the model at `path`, cut at the LayerNorm after which about half of its MatMuls
    have run and only the hidden state crosses (a post-LN transformer between two layers): the first half's one
    output is that hidden state, the second half reads it as HIDDEN besides whichever inputs it still needs (the
    attention mask is recomputed from them). None when no LayerNorm is such a cut."""
    import openvino as ov

    model = _read(core, path, weights)
    cut = _middle_cut(model)
    if cut is None:
        return None
    end = _node(model, cut)
    reads = _upstream([end])
    first = ov.Model([end.output(0)], [p for p in model.get_parameters() if p.get_friendly_name() in reads], "first")
    return first, _second_half(_read(core, path, weights), cut)


def guarded_pair(core, path: str, weights: WeightsFile | None = None):
    """(the whole model, the second half of `split_in_the_middle`) for a guarded session, or a bf16 one that may fall
    back to guarding: the whole model with two more outputs after its own, the hidden state at the middle cut (what
    the second half reads as HIDDEN) and the final token states (the last LayerNorm's output, which the pooling
    averages). None when it has no middle cut, or when its first output is not a pooled export's sentence rows (no
    row to put a guarded one back in)."""
    model = _read(core, path, weights)
    if model.output(0).get_partial_shape().rank.get_length() != 2:
        return None
    ends = _layer_norm_ends(model)
    cut = _middle_cut(model, ends)
    if cut is None:
        return None
    model.add_outputs([_node(model, cut).output(0), _node(model, ends[-1]).output(0)])
    return model, _second_half(_read(core, path, weights), cut)


def _second_half(model, cut: str):
    """`model` from the LayerNorm output named `cut` on, reading that hidden state as HIDDEN (in f32, its 16-bit
    weights kept so)."""
    import openvino as ov
    import openvino.opset13 as ops

    end = _node(model, cut)
    hidden = ops.parameter(end.get_output_partial_shape(0), end.get_output_element_type(0), name=HIDDEN)
    hidden.output(0).get_tensor().set_names({HIDDEN})
    for target in list(end.output(0).get_target_inputs()):
        target.replace_source_output(hidden.output(0))
    reads = _upstream(model.get_results())
    second = ov.Model(model.get_results(),
                      [hidden] + [p for p in model.get_parameters() if p.get_friendly_name() in reads], "second")
    _keep_f16_weights_16bit(second)
    return second


def sentence_lengths(inputs: dict[str, np.ndarray], sentences: int = 0) -> np.ndarray:
    """The token count of each sentence of a packed call, in order; `sentences` > 0: only the first that many
    segments are sentences (the rest is padding)."""
    lengths = np.bincount(inputs["segment_ids"][0])
    return lengths[:sentences] if sentences else lengths


def cancelling_sentences(states: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices of a pack's sentences of at most GUARD_TOKENS tokens whose final token `states` ([tokens, hidden])
    nearly cancel in their mean (|their sum| < GUARD_RATIO × the sum of their norms); `lengths`: the sentences'
    token counts (`sentence_lengths`)."""
    if not (lengths <= GUARD_TOKENS).any():
        return np.empty(0, dtype=np.int64)
    end = int(lengths.sum())
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    sums = np.add.reduceat(states[:end], starts, axis=0, dtype=np.float64)
    norm_sums = np.add.reduceat(np.linalg.norm(states[:end], axis=1), starts, dtype=np.float64)
    return np.flatnonzero((lengths <= GUARD_TOKENS) & (np.linalg.norm(sums, axis=1) < GUARD_RATIO * norm_sums))


def guard_pack(middle: np.ndarray, inputs: dict[str, np.ndarray], lengths: np.ndarray, chosen: list[int],
               names: list[str]) -> dict:
    """The second half's inputs (`names`) for the `chosen` sentences of a pack alone, from its middle hidden state
    ([1, tokens, hidden]), its packed `inputs` and its sentences' `lengths`, padded to the first of
    GUARD_PACK_TOKENS they fit as a segment of its own."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    taken = np.concatenate([np.arange(starts[k], starts[k] + lengths[k]) for k in chosen])
    pad = next(n for n in GUARD_PACK_TOKENS if n >= taken.size) - taken.size
    kept = [int(lengths[k]) for k in chosen] + [pad]
    feeds = {"segment_ids": np.repeat(np.arange(len(kept), dtype=np.int64), kept)[None],
             "position_ids": np.concatenate([np.arange(n, dtype=np.int64) for n in kept])[None]}
    for name in names:
        if name not in feeds:
            source = middle if name == HIDDEN else inputs[name]
            padding = np.zeros((1, pad) + source.shape[2:], dtype=source.dtype)
            feeds[name] = np.concatenate([source[:, taken], padding], axis=1)
    return {name: feeds[name] for name in names}


def _read(core, path: str, weights: WeightsFile | None):
    return core.read_model(path) if weights is None else core.read_model(Path(path).read_text(), weights.tensor())


def _native_bf16(core) -> bool:
    return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _keep_f16_weights_16bit(model) -> None:
    """keep_weights_16bit where `model` stores fp16 weights (and is compiled for f32)."""
    if any(op.get_type_name() == "Constant" and op.get_element_type().get_type_name() == "f16"
           for op in model.get_ops()):
        keep_weights_16bit(model)


def _layer_norm_ends(model) -> list[str]:
    """Friendly names of the LayerNorms' outputs (MVN, then its scale and shift), in order."""
    ends = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MVN":
            continue
        end = op
        for kind in ("Multiply", "Add"):
            readers = _readers(end)
            if len(readers) != 1 or readers[0].get_type_name() != kind:
                break
            end = readers[0]
        ends.append(end.get_friendly_name())
    return ends


def _middle_cut(model, ends: list[str] | None = None) -> str | None:
    """The friendly name of the LayerNorm output (`_layer_norm_ends`) for split_in_the_middle."""
    matmuls = {op.get_friendly_name() for op in model.get_ops() if op.get_type_name() == "MatMul"}
    best = None
    for name in _layer_norm_ends(model) if ends is None else ends:
        end = _node(model, name)
        first = _upstream([end]) & matmuls
        second = _upstream(model.get_results(), stop=name) & matmuls
        if not first or not second or first & second:  # a half with nothing to do, or work done twice
            continue
        balance = abs(len(first) - len(matmuls) / 2)
        if best is None or balance < best[0]:
            best = (balance, name)
    return best and best[1]


def _upstream(nodes, stop: str | None = None) -> set[str]:
    """Friendly names of `nodes` and of every node they read from, not reading past the node named `stop`."""
    seen: set[str] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        name = node.get_friendly_name()
        if name in seen:
            continue
        seen.add(name)
        if name != stop:
            todo.extend(value.get_node() for value in node.input_values())
    return seen


def _node(model, name: str):
    return next(op for op in model.get_ops() if op.get_friendly_name() == name)


class OpenVinoSession:
    """`session(inputs)` runs one call; `session.map([inputs, ...])` runs them `parallel` at a time, each on an
    idle infer request from a thread of its own (OpenVINO releases the GIL while it infers; an error comes back to
    the caller, where one in AsyncInferQueue's callback aborted the process). `sentences`: how many of a packed
    call's segments are sentences, for a session that guards them (`guarded`; 0: every segment)."""

    guarded = False  # bf16-guarded: cancelling short sentences run their second half again in f32

    def __init__(self, path: str, params: dict[str, str]):
        import openvino as ov

        streams, threads = stream_layout(cpu_limit() or len(os.sched_getaffinity(0)), int(params.get("threads", "0")),
                                         int(params.get("streams", "0")))
        config = {
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": streams,
            "INFERENCE_NUM_THREADS": threads,
            # Other processes (the tokenizer, other models of an MME) share the cores: no thread owns one.
            "ENABLE_CPU_PINNING": False,
        }
        core = ov.Core()
        self._path, self._params = path, params
        self._weights = WeightsFile(str(Path(path).with_suffix(".bin"))) if path.endswith(".xml") else None
        if problem := precision_problem(params):
            raise ValueError(f"parameter precision: {problem}")
        precision = params.get("precision", "fp32")
        # the guard reads a packing runner's sentences (segment_ids) and their pooled rows: without them it is mixed
        self._packing = int(params.get("max_pack_tokens", "0")) > 0
        if precision == GUARDED and not self._packing:
            precision = MIXED
        native = _native_bf16(core)
        # bf16 is one whole compile: where it holds the floor it runs 3-4 % faster per call than the split's two bf16
        # halves and holds 10-26 MB less (docs/performance.md, forty-ninth round). For a packing runner it carries the
        # guard's outputs, which cost nothing measurable (seventieth), so where it misses the floor its fall-back,
        # bf16-guarded, compiles only the f32 second half beside it (`reopened`).
        pair = guarded_pair(core, path, self._weights) if native and self._packing and precision in ("bf16", GUARDED) \
            else None
        halves = split_in_the_middle(core, path, self._weights) if native and precision in (MIXED, GUARDED) \
            and not pair else None
        if pair:
            stages = [(pair[0], "bf16")]
        elif halves:
            stages = list(zip(halves, ("bf16", "f32")))
        else:  # mixed or bf16-guarded without native bf16, or without a cut, is f32 throughout
            hint = "f32" if precision in (MIXED, GUARDED) else OPENVINO_PRECISION[precision]
            stages = [(read_model(core, path, hint, self._weights), hint)]
        self._core, self._config = core, config
        self._matrix_weights: set[tuple[int, int]] = set()
        self._stage_computes, self._stage_inputs, self._outputs = [], [], []
        compiled = [self._add_stage(model, hint) for model, hint in stages]
        # the whole model's own outputs: the guard's two (middle and final states) come after them
        own = len(compiled[0].outputs) - (2 if pair else 0)
        self._outputs[0], self._guard_states = self._outputs[0][:own], [port for _, port in self._outputs[0][own:]]
        self.parallel, self.threads = streams, threads
        self._idle = queue.SimpleQueue()
        for _ in range(streams):
            self._idle.put([c.create_infer_request() for c in compiled])
        self._second_half = pair[1] if pair else None  # compiled once the session guards
        if precision == GUARDED and pair:
            self._guard()
        self._serve(precision)
        self._threads = ThreadPoolExecutor(streams, thread_name_prefix="openvino") if streams > 1 else None
        self._called = False

    def _add_stage(self, model, hint: str):
        """`model` compiled at OpenVINO precision `hint`, as the next stage: what it computes, reads and outputs."""
        compiled = self._core.compile_model(model, "CPU", {**self._config, "INFERENCE_PRECISION_HINT": hint})
        if self._weights:
            self._matrix_weights.update(self._weights.matrix_weights(model))
        self._stage_computes.append(compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())
        self._stage_inputs.append([port.get_any_name() for port in compiled.inputs])
        self._outputs.append([(port.get_any_name(), port) for port in compiled.outputs])
        return compiled

    def _guard(self) -> None:
        """From now on cancelling short sentences run the second half again in f32: it is compiled as the second
        stage and each set of infer requests gets a request for it, run once at every GUARD_PACK_TOKENS length (no
        call waits for a shape's first run). Called while no call runs (at open, or by the load-time check)."""
        second = self._add_stage(self._second_half, "f32")
        self._second_half = None
        for requests in [self._idle.get() for _ in range(self.parallel)]:
            requests.append(second.create_infer_request())
            for tokens in GUARD_PACK_TOKENS:
                requests[1].infer({port.get_any_name(): np.zeros([1, tokens] + [
                    d.get_length() for d in port.get_partial_shape()[2:]], port.get_element_type().to_dtype())
                    for port in second.inputs})
            self._idle.put(requests)
        self.guarded = True

    def _serve(self, precision: str) -> None:
        """What `precision` computes through the compiled stages: `_route`, the stages every call runs."""
        self._route = [0] if len(self._stage_computes) == 1 or self.guarded else [0, 1]
        # bf16 or f32 here; bf16+f32 for a split model
        self.computes = "+".join(dict.fromkeys(self._stage_computes[i] for i in self._route))
        if self.guarded:
            self.computes = f"bf16, cancelling sentences of up to {GUARD_TOKENS} tokens bf16+f32"
        self.fallback = FALLBACK.get(precision) if self.computes != "f32" else None  # nothing more to give up
        if self.fallback and self.fallback[0] == GUARDED and not self._packing:
            self.fallback = FALLBACK[GUARDED]

    def reopened(self, precision: str) -> OpenVinoSession:
        """This session's model opened at `precision` (its `fallback`): a bf16 session guards itself, its whole
        compile kept (the load-time check calls it before any other call runs); otherwise a new session."""
        if precision == GUARDED and self._second_half is not None:
            self._guard()
            self._serve(precision)
            return self
        return OpenVinoSession(self._path, {**self._params, "precision": precision})

    def __call__(self, inputs: dict[str, np.ndarray], sentences: int = 0) -> dict[str, np.ndarray]:
        requests = self._idle.get()
        try:
            rows, result = self._routed_call(requests, inputs)
            if self.guarded:
                self._guard_rows(requests, inputs, sentences, rows, result)
        finally:
            self._idle.put(requests)
        self._called = True
        return rows

    def _routed_call(self, requests, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], object]:
        """The stages of `_route` chained, each reading the one before's output: (the last stage's own outputs,
        copied, as the requests serve other calls once idle; its whole result, read in place while this call holds
        the requests)."""
        hidden = None
        for stage in self._route:
            # a first half's one output is the next half's HIDDEN
            result = requests[stage].infer({n: hidden if n == HIDDEN else inputs[n] for n in self._stage_inputs[stage]},
                                           share_inputs=True, share_outputs=True)
            hidden = next(iter(result.values()))
        return {name: np.array(result[port]) for name, port in self._outputs[self._route[-1]]}, result

    def _guard_rows(self, requests, inputs: dict[str, np.ndarray], sentences: int, rows: dict[str, np.ndarray],
                    result) -> None:
        """Replace the `rows` of the whole bf16 call's cancelling sentences by the second half's in f32, run from the
        bf16 middle state in its `result`."""
        middle, final = (result[port] for port in self._guard_states)
        lengths = sentence_lengths(inputs, sentences)
        chosen = cancelling_sentences(final[0], lengths)
        if not chosen.size:
            return
        slots = min(len(values) for values in rows.values())
        for members in pack_groups(lengths[chosen].tolist(), GUARD_PACK_TOKENS[-1], slots):
            group = chosen[members].tolist()
            again = requests[1].infer(guard_pack(middle, inputs, lengths, group, self._stage_inputs[1]),
                                      share_inputs=True)
            for name, port in self._outputs[1]:
                rows[name][group] = again[port][:len(group)]

    def warmed(self) -> int:
        """Called once every input shape the runner sends has run on every infer request: the file pages of the
        matrix weights go back to the kernel (the plugin holds them in its own layouts now); the bytes dropped. The
        load-time check is over by then: a bf16 session that did not fall back lets go of the second half it could
        have guarded with."""
        self._second_half = None
        return self._weights.release(sorted(self._matrix_weights)) if self._weights else 0

    def unmap_file_pages(self) -> None:
        """Called once the model is idle (resident_memory.ReleasedWhenIdle): the weights file's pages that calls mapped
        go back to the page cache. They are the embedding rows the calls' tokens read (OpenVINO gathers them from the
        file in place), each mapped with its neighbours: MiniLM's whole 23 MB table under varied text. The next call
        maps back the rows it reads (docs/performance.md, fifty-third round)."""
        if self._weights:
            self._weights.unmap()

    def map(self, calls: list[dict[str, np.ndarray]],
            sentences: list[int] | None = None) -> list[dict[str, np.ndarray]]:
        sentences = sentences or [0] * len(calls)
        if self._threads is None or len(calls) < 2:
            return [self(inputs, n) for inputs, n in zip(calls, sentences)]
        if not self._called:
            # The first call runs alone: two threads entering OpenVINO's Python bindings for the first time
            # deadlocked on the one-time initialisation of its numpy API (seen with gdb).
            return [self(calls[0], sentences[0])] + list(self._threads.map(self, calls[1:], sentences[1:]))
        return list(self._threads.map(self, calls, sentences))


def open_session(path: str, params: dict[str, str]) -> OpenVinoSession:
    return OpenVinoSession(path, params)
