"""The part of a framework runner model (ONNX Runtime, TorchScript, TensorFlow) that is not the framework.

A runner model executes a real artifact with its Python library behind the exact tensor contract the native
backend would have. Inputs marked `allow_ragged_batch` carry a sequence axis that may differ between
requests. Rows of similar real length (from `attention_mask`, else whole requests by their length) are grouped
(`length_groups`), each group is padded to its own longest and run in one call, and outputs whose first dim is
-1 are given back in each request's own shape. With `max_pack_tokens` set (a packed text encoder, see
packing.py) rows are not padded at all: up to that many real tokens (and `max_pack_rows` sentences) run as one
sequence, and a session that runs several calls at once (`parallel` > 1, `map`: OpenVINO's infer requests on one
compiled model) gets each batch as that many packs together. With a `reference` file (the build's texts and their
PyTorch embeddings) the runner checks itself at load on the CPU it runs on (`_check_reference`). With a `tokenizer`
the runner reads TEXT and batches requests itself (text_requests.py). `index_rows` (`input_ids:30522,…`) names the
inputs that index a table and its rows: a request with an id outside them is refused (OpenVINO's Gather answered
such an id with a row of zeros, torch's embedding raised).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
from batched_requests import ClientError, pad_and_concat, read_input, respond_all, split_rows
from packing import PACKED_FEATURES, pack_groups, packed_inputs, unpacked
from pooling import mean_pool
from resident_memory import ReleasedWhenIdle, drop_load_only_file_pages, return_freed_heap

MASK = "attention_mask"  # when an input has this name, rows are grouped by its real length
MAX_PADDING_WASTE = 0.25  # a group of ragged requests may hold at most this fraction of padding tokens
PACK_MULTIPLE = 16  # packs are padded to a multiple of this many tokens (packing.packed_inputs says why)
# The load-time check embeds reference texts of up to this many tokens first: where a reduced precision misses the
# floor, it misses it on short texts (docs/performance.md, eighteenth round), so a session below it there that can
# fall back does so without computing the long ones, four fifths of the check's time (thirty-fifth round). A session
# with nothing to fall back to (f32) embeds only these: what it can still find is an artifact that is not the one the
# build checked on every text, and short texts find that (seventy-third round).
SHORT_REFERENCE_TOKENS = 16
# On a GPU a call's fixed cost is what padding is weighed against: MiniLM's TorchScript on an H200 took 2.2 ms for
# one sentence and 8.1 ms for 32 padded to their longest (~7,300 tokens), ~0.8 µs a token, so a call costs as much
# as ~2,500 padding tokens; the CPU's share alone split a request of 32 into calls that made it 3x slower served
# (docs/performance.md, fortieth round). A session that runs on a GPU says so (`on_gpu`).
GPU_FREE_PADDING_TOKENS = 2500


def length_groups(shapes: list[tuple[int, int]], max_waste: float = MAX_PADDING_WASTE,
                  free_padding: int = 0) -> list[list[int]]:
    """Indices of requests, shaped (rows, sequence length), grouped so each group's padding stays small.

    Requests are sorted by length and a group grows while padding everyone to its longest wastes at most
    `max_waste` of the group's tokens, or at most `free_padding` tokens whatever the share: one framework call per
    group instead of one for the whole batch padded to its longest (short sentences batched with a long one cost as
    much as the long one), unless a call costs more than that much padding.
    """
    order = sorted(range(len(shapes)), key=lambda i: shapes[i][1])
    groups: list[list[int]] = []
    rows = real = 0
    for i in order:
        n, length = shapes[i]
        padded, used = (rows + n) * length, real + n * length
        if groups and (padded <= (1 + max_waste) * used or padded - used <= free_padding):
            groups[-1].append(i)
            rows, real = rows + n, used
        else:
            groups.append([i])
            rows, real = n, n * length
    return groups


class FrameworkRunnerModel:
    """Subclasses set `pb_utils` and `open_session(path, params)` → callable(dict[name, array]) → dict."""

    pb_utils = None
    max_pack_tokens = 0  # set from the config's parameters in initialize; 0: the artifact is not packed
    max_pack_rows = 0  # 0: no limit on sentences per pack
    free_padding = 0  # padding tokens a group may hold whatever their share (GPU_FREE_PADDING_TOKENS on a GPU)
    released_when_idle = nullcontext()  # initialize starts a ReleasedWhenIdle; none in a runner set up in-process

    def initialize(self, args):
        self.released_when_idle = ReleasedWhenIdle(also_release=self._session_hook("release_cached_memory"),
                                                   also_unmap=self._session_hook("unmap_file_pages"))
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.output_names = [o["name"] for o in config["output"]]
        self.text = None
        if params.get("tokenizer"):  # reads TEXT: tokenizes each request, batches them itself
            self.input_names, self.ragged = params["token_inputs"].split(","), True
            if self.pb_utils is not None:  # in Triton; in-process callers (the bench) run token tensors through _run
                self.text = importlib.import_module("text_requests").TextRequests(
                    self.pb_utils, config, params, os.path.join(folder, params["tokenizer"]), self._run,
                    self._tensors)
        else:
            self.input_names = [i["name"] for i in config["input"]]
            self.ragged = any(i.get("allow_ragged_batch") for i in config["input"])
        self.trimmed_outputs = {o["name"] for o in config["output"] if self.ragged and int(o["dims"][0]) == -1}
        self.max_pack_tokens = int(params.get("max_pack_tokens", "0"))
        self.max_pack_rows = int(params.get("max_pack_rows", "0"))
        self.index_rows = {name: int(rows) for name, rows in
                           (entry.split(":") for entry in params.get("index_rows", "").split(",") if entry)}
        if unknown := set(self.index_rows) - set(self.input_names):
            raise ValueError(f"parameter index_rows names {sorted(unknown)}, not inputs of this model")
        path = os.path.join(folder, params["artifact"])
        self.session = self.open_session(path, params)
        self.max_padding_waste = float(params.get("max_padding_waste", MAX_PADDING_WASTE))
        self.free_padding = int(params.get("free_padding_tokens",
                                           GPU_FREE_PADDING_TOKENS if getattr(self.session, "on_gpu", False) else 0))
        checked = bool(params.get("reference"))
        if checked:
            self._check_reference(params, os.path.join(folder, params["reference"]))
        self._stop_warming = threading.Event()
        self.warming = None
        if self.max_pack_tokens:
            shapes = self._pack_shapes()
            if not checked:  # the first call runs before any other thread uses the session (the check was one)
                self._warm(shapes[:1])
                shapes = shapes[1:]
            self.warming = threading.Thread(target=self._warm_then_settle, args=(shapes,), name="warm-pack-shapes",
                                            daemon=True)
            self.warming.start()
        else:
            drop_load_only_file_pages()

    def _session_hook(self, name: str) -> Callable[[], None]:
        """A call of the session's `name` (release_cached_memory, unmap_file_pages): nothing where it has none."""
        def call() -> None:
            if hook := getattr(self.session, name, None):  # a call has ended: there is a session
                hook()
        return call

    def _check_reference(self, params: dict[str, str], reference_path: str):
        """Embed the build's reference texts and compare with the embeddings the build computed with PyTorch. The CPU
        picks the precision (bf16 where it has native bf16, which the build's CPU may not have had): a session whose
        reduced precision falls below the floor here is reopened at the precision it names (`session.fallback`: bf16
        with cancelling short sentences guarded, bf16 up to the middle layer, then fp32); one that does not reach it
        in fp32 refuses to load, as its artifact is not what the build checked."""
        with np.load(reference_path) as data:
            reference = {name: data[name] for name in data.files}
        expected, floor = reference.pop("embedding"), float(reference.pop("min_cosine"))
        inputs = {name: reference[name] for name in self.input_names}
        cosine, checked = self._reference_cosine(inputs, expected, floor)
        while not cosine >= floor and getattr(self.session, "fallback", None):
            precision, described = self.session.fallback
            self._log("warn", f"{session_computes(self.session)} on this CPU: min cosine {cosine:.6f} < {floor} on "
                              f"{_some_of(checked, len(expected))}the build's {len(expected)} reference texts; "
                              f"running {described} instead")
            self.session = self.session.reopened(precision)
            cosine, checked = self._reference_cosine(inputs, expected, floor)
        computes = session_computes(self.session)
        if not cosine >= floor:
            raise RuntimeError(f"{reference_path}: embeddings of {_some_of(checked, len(expected))}its "
                               f"{len(expected)} reference texts reach min cosine {cosine:.6f} < {floor} ({computes} "
                               f"on this CPU): {params['artifact']} is not the artifact the build checked; rebuild "
                               f"the repository")
        self._log("info", f"{checked} of {len(expected)} reference texts: min cosine {cosine:.6f} to the build's "
                          f"({computes})")

    def _reference_cosine(self, inputs: dict[str, np.ndarray], expected: np.ndarray, floor: float) -> tuple[float, int]:
        """(min cosine of this session's embeddings of the reference texts to `expected`, how many it embedded): the
        short texts first, then the others only where the session can fall back and the short ones reach `floor`."""
        tokens = inputs[MASK].sum(1)
        cosine, checked = np.inf, 0
        for rows in np.flatnonzero(tokens <= SHORT_REFERENCE_TOKENS), np.flatnonzero(tokens > SHORT_REFERENCE_TOKENS):
            if not rows.size:
                continue
            if checked and not (cosine >= floor and getattr(self.session, "fallback", None)):
                break
            texts = {name: value[rows, :tokens[rows].max()] for name, value in inputs.items()}
            cosine = float(np.minimum(cosine, self._min_cosine(texts, expected[rows])))  # NaN stays NaN
            checked += rows.size
        return cosine, checked

    def _min_cosine(self, inputs: dict[str, np.ndarray], expected: np.ndarray) -> float:
        actual = np.asarray(self._run([inputs])[0][self.output_names[0]], dtype=np.float64)
        if actual.ndim == 3:  # token embeddings (trimmed to the longest text): pooled as the pooling step does
            actual = mean_pool(actual, inputs[MASK][:, :actual.shape[1]], normalize=False)
        actual = actual / np.linalg.norm(actual, axis=1, keepdims=True)
        return float((actual * expected).sum(1).min())

    def _log(self, level: str, message: str):
        if self.pb_utils is not None:
            getattr(self.pb_utils.Logger, f"log_{level}")(message)

    def finalize(self):
        if self.text is not None:  # what is queued is answered first
            self.text.close()
        if self.warming is not None:
            self._stop_warming.set()
            self.warming.join()
        self.released_when_idle.close()

    def execute(self, requests):
        if self.text is not None:
            return self.text.execute(requests)  # None: each request is answered through its sender
        return respond_all(self.pb_utils, requests, self._parse, self._run, self._tensors, self.pb_utils.Logger)

    def _tensors(self, outputs):
        return [self.pb_utils.Tensor(name, outputs[name]) for name in self.output_names]

    def _parse(self, request):
        item = {name: read_input(self.pb_utils, request, name) for name in self.input_names}
        if any(a.ndim == 0 or len(a) == 0 for a in item.values()):
            raise ClientError(f"every input needs at least one row, got shapes "
                              f"{ {name: list(a.shape) for name, a in item.items()} }")
        if MASK in item and any(a.shape != item[MASK].shape for a in item.values()):
            raise ClientError(f"every token input must be shaped like {MASK}, got shapes "
                              f"{ {name: list(a.shape) for name, a in item.items()} }")
        if self.max_pack_tokens and not (item[MASK].ndim == 2 and 0 < item[MASK].shape[1] <= self.max_pack_tokens
                                         and _right_padded(item[MASK]) and item[MASK][:, 0].all()):
            raise ClientError(f"{MASK} must be [rows, tokens] of 1s then 0s (right padding), at least one real token "
                              f"per row, 1 to {self.max_pack_tokens} tokens long, for this encoder")
        checked = item if self.max_pack_tokens else self.index_rows  # every token input is checked once
        lowest = {name: item[name].min() for name in checked if item[name].size}
        if self.max_pack_tokens and min(lowest.values(), default=0) < 0:
            raise ClientError("token inputs cannot be negative")
        for name, rows in self.index_rows.items():
            if name in lowest and (lowest[name] < 0 or item[name].max() >= rows):
                raise ClientError(f"{name} indexes a table of {rows} rows: ids 0 to {rows - 1}, got {lowest[name]} "
                                  f"to {item[name].max()}")
        return item

    def _run(self, items):
        with self.released_when_idle:
            return self._compute(items)

    def _compute(self, items):
        if self.max_pack_tokens:
            return self._run_packed(items)
        if not self.ragged or items[0][self.input_names[0]].ndim < 2:
            return self._run_padded(items)
        if MASK in self.input_names and all(_right_padded(item[MASK]) for item in items):
            return self._run_rows(items)
        if len(items) == 1:
            return self._run_padded(items)
        results: list = [None] * len(items)
        shapes = [item[self.input_names[0]].shape[:2] for item in items]
        for group in length_groups(shapes, self.max_padding_waste, self.free_padding):
            for i, result in zip(group, self._run_padded([items[i] for i in group])):
                results[i] = result
        return results

    def _run_rows(self, items):
        """Group the rows of all requests by their real length (from the attention mask), run each group padded to
        its own longest, and put every row back in its request's shape (positions past a row's group's longest
        are zero; those up to it hold whatever the encoder gave the padding, which pooling masks out)."""
        rows = [(i, r, max(int(mask.sum()), 1)) for i, item in enumerate(items) for r, mask in enumerate(item[MASK])]
        results = [{} for _ in items]
        for group in length_groups([(1, length) for _, _, length in rows], self.max_padding_waste,
                                   self.free_padding):
            longest = max(rows[k][2] for k in group)
            batch = {n: np.stack([_fit(items[rows[k][0]][n][rows[k][1]], longest)
                                  for k in group]) for n in self.input_names}
            outputs = self.session(batch)
            for name in self.output_names:
                values = np.asarray(outputs[name])
                for j, k in enumerate(group):
                    i, r, _ = rows[k]
                    if name not in results[i]:
                        rows_i, length_i = items[i][MASK].shape
                        shape = (rows_i, length_i) + values.shape[2:] if name in self.trimmed_outputs \
                            else (rows_i,) + values.shape[1:]
                        results[i][name] = np.zeros(shape, dtype=values.dtype)
                    if name in self.trimmed_outputs:
                        keep = min(longest, results[i][name].shape[1])
                        results[i][name][r, :keep] = values[j, :keep]
                    else:
                        results[i][name][r] = values[j]
        return results

    def _pack_shapes(self) -> list[int]:
        """The length of every pack the runner can send: multiples of PACK_MULTIPLE up to max_pack_tokens."""
        return list(range(PACK_MULTIPLE, self.max_pack_tokens + 1, PACK_MULTIPLE))

    def _warm(self, shapes: list[int]) -> bool:
        """Run each pack shape the runner can send (`_pack_shapes`) once, on every stream; True when all ran. A
        runtime keeps state per input shape: warmed, memory is at its steady state seconds after load and no
        request waits for a shape's first run. Started in the background by initialize (warming all 16 shapes at
        load added seconds to a cold start); requests share the session with it meanwhile."""
        for length in shapes:
            if self._stop_warming.is_set():
                return False
            row = {n: np.zeros(length, dtype=np.int64) for n in PACKED_FEATURES if n in self.input_names}
            try:
                self._run_all([packed_inputs([row], PACK_MULTIPLE)] * self._parallel(), [1] * self._parallel())
            except Exception as e:  # noqa: BLE001 - not fatal: a request of that shape reports its own error
                self._log("warn", f"warming pack length {length} failed: {e}")
                return False
        return True

    def _warm_then_settle(self, shapes: list[int]):
        """Warm the remaining shapes; once every shape has run, what the process holds for nothing goes back to
        the kernel: the file pages of weights the session now holds in layouts of its own (`warmed`: OpenVINO's),
        the heap memory that opening, checking and warming freed (`return_freed_heap`), then the library pages
        only loading read (`drop_load_only_file_pages`)."""
        if not self._warm(shapes):
            return
        released = []
        if hasattr(self.session, "warmed"):
            try:
                released.append(f"{self.session.warmed() / 2**20:.1f} MB of weights file pages released")
            except OSError as e:  # not fatal: the pages stay resident
                self._log("warn", f"releasing the weights file's pages failed: {e}")
        released.append(f"{return_freed_heap() / 2**20:.1f} MB of freed heap returned")
        released.append(f"{drop_load_only_file_pages() / 2**20:.1f} MB of library pages unmapped")
        self._log("info", "every pack length warmed; " + ", ".join(released))

    def _parallel(self) -> int:
        return getattr(self.session, "parallel", 1)

    def _run_all(self, feeds: list[dict], sentences: list[int]) -> list[dict]:
        """Every call's outputs, in order (`sentences`: how many of each pack's segments are sentences, for a session
        that guards them); a session that runs several at once gets them all together."""
        if not getattr(self.session, "guarded", False):
            return self.session.map(feeds) if self._parallel() > 1 else [self.session(f) for f in feeds]
        if self._parallel() > 1:
            return self.session.map(feeds, sentences)
        return [self.session(f, n) for f, n in zip(feeds, sentences)]

    def _run_packed(self, items):
        """Run the rows of all requests as packs of ≤ max_pack_tokens real tokens (no padding) and put every row
        back in its request: token outputs ([1, tokens, ...]) in the request's shape with zeros where it was
        padded, row outputs of a pooling export ([rows of the pack, or its sentence slots, ...]) row by row."""
        rows = [(i, r, max(int(mask.sum()), 1)) for i, item in enumerate(items) for r, mask in enumerate(item[MASK])]
        results = [{} for _ in items]
        packs = [[rows[k] for k in group] for group in pack_groups(
            [length for _, _, length in rows], self.max_pack_tokens, self.max_pack_rows, self._parallel())]
        all_feeds = [packed_inputs([{n: items[i][n][r, :length] for n in PACKED_FEATURES if n in items[i]}
                                    for i, r, length in members], PACK_MULTIPLE) for members in packs]
        for members, outputs in zip(packs, self._run_all(all_feeds, [len(members) for members in packs])):
            for name in self.output_names:
                values, trimmed = np.asarray(outputs[name]), name in self.trimmed_outputs
                per_row = unpacked(values, [m[2] for m in members]) if trimmed else values
                for (i, r, length), row in zip(members, per_row):
                    if name not in results[i]:
                        rows_i, width = items[i][MASK].shape
                        shape = (rows_i, width) + row.shape[1:] if trimmed else (rows_i,) + row.shape
                        results[i][name] = np.zeros(shape, dtype=row.dtype)
                    if trimmed:
                        keep = min(length, results[i][name].shape[1])
                        results[i][name][r, :keep] = row[:keep]
                    else:
                        results[i][name][r] = row
        return results

    def _run_padded(self, items):
        batch = {n: pad_and_concat([item[n] for item in items]) for n in self.input_names}
        outputs = self.session(batch)
        sizes = [len(item[self.input_names[0]]) for item in items]
        lengths = [item[self.input_names[0]].shape[1] for item in items] if self.ragged else None
        per_output = {
            name: split_rows(np.asarray(outputs[name]), sizes, lengths if name in self.trimmed_outputs else None)
            for name in self.output_names
        }
        return [{name: per_output[name][i] for name in self.output_names} for i in range(len(items))]

    def open_session(self, path, params):
        raise NotImplementedError


def session_computes(session) -> str:
    """The precision a session's matrix products run in on this CPU (bf16, f32); f32 when it does not say."""
    return getattr(session, "computes", "f32")


def _some_of(checked: int, total: int) -> str:
    """"33 of " where a check embedded 33 of its 40 texts; nothing where it embedded them all."""
    return "" if checked == total else f"{checked} of "


def _right_padded(mask: np.ndarray) -> bool:
    """Every row's real tokens come first (BERT-style right padding), so trimming a row keeps them all."""
    lengths = mask.sum(axis=1)
    return bool((mask == (np.arange(mask.shape[1]) < lengths[:, None])).all())


def _fit(row: np.ndarray, length: int) -> np.ndarray:
    """One row cut or padded with zeros along its first axis to `length`."""
    if len(row) >= length:
        return row[:length]
    return np.pad(row, [(0, length - len(row))] + [(0, 0)] * (row.ndim - 1))
