"""The GPU runs plan of docs/performance.md: `bert_pt` portable served by the bundled tritonserver with its encoder's
TorchScript on a CUDA GPU, against sentence-transformers on the same GPU.

Two halves, because the lent GPU machine has CUDA torch, Python 3.12 and no network, and takes 64 MiB per call:

    python -m benchmarks.gpu_run carry        # here: writes .gpu/ (about 63 MiB with the checkout)
    python3 -m benchmarks.gpu_run run OUT     # there, from the checkout with .gpu/ carried: results in OUT/

`carry` packs what that machine lacks: the bundled tritonserver with the python backend, its 3.12 stub and the
libraries they load; numpy 1 for that stub; Triton's model-config schema, protobuf and isal for tritonpack itself;
MiniLM's weights in 16 bits (the 64 MiB limit; `run` widens them back to 32 bits, so the served model computes in
fp32 from fp16-rounded weights, within a cosine of 1e-6 of the original); the corpus and held-out texts with
sentence-transformers' fp32 embeddings of the latter, made here on the CPU from the original weights.

`run` builds `bert_pt` portable with tritonpack's own build (`--no-env`: the stub runs that machine's Python), serves
it with dynamic batching on and off, and times served sentences/s by concurrency against sentence-transformers
in-process on the same GPU (batch 64), with cosines against the CPU reference; Triton's statistics say where each
served request's time went (per step: queued, computing), and the served encoder's own session is timed in-process
per call (one sentence, 32 padded). `--skip` leaves stages out; `--serving KEY=VALUE`
sets the builds' serving settings (a queue delay to compare, say); `--client-processes N` spreads the clients over N
processes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import io
import json
import lzma
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("tritonpack") is None:  # the lent machine runs a bare checkout: nothing installed it
    sys.path.insert(0, str(ROOT / "src"))

from benchmarks import meters  # noqa: E402
from benchmarks.meters import Run, side_summary  # noqa: E402
from benchmarks.sides import ConcurrentClients, cosine_min  # noqa: E402

CARRY = ROOT / ".gpu"
STUB_PYTHON = "3.12"  # the lent machine's python3
# The stub of Triton 2.51 binds numpy with pybind11 2.10, which reads numpy 2's arrays wrongly (containers.py,
# NUMPY1_STUB_LAST): the lent machine's Python has numpy 2, so its stubs get this numpy 1 (this environment's),
# without what serving never imports (the transfer limit).
STUB_NUMPY = "stub-numpy"
STUB_NUMPY_UNUSED = re.compile(r"/tests/|/include/|\.(pyi|pxd|a|h)$|^numpy/(f2py|distutils|_pyinstaller|array_api|"
                               r"testing|typing|doc|random/_examples)/|_simd\.|"
                               r"_(umath|rational|struct_ufunc|operand_flag)_tests")
TIMED_SENTENCES = 2048
HELD_OUT = 64
SINGLE_CLIENT_SENTENCES = 512  # c=1 runs a request at a time: a quarter of the corpus keeps the call short
IDLE_WAIT_S = 3.0  # past resident_memory.IDLE_S (2 s): the stubs have handed back their cached device memory


# ---- here ---------------------------------------------------------------------------------------------------------

def _pytriton_libraries(binaries: list[Path]) -> list[Path]:
    """The bundled libraries (nvidia_pytriton.libs) that `binaries` load, found with ldd."""
    found = set()
    for binary in binaries:
        listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
        for line in listing.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and "nvidia_pytriton.libs" in parts[1]:
                found.add(Path(parts[1].split()[0]).resolve())
    return sorted(found)


def _icu_data_stub(name: str, work: Path) -> Path:
    """libxml2 links ICU, whose 29 MB data library the server never reads (it converts no encodings): a library
    with the same name and symbol keeps the server loadable within the transfer limit (checked by serving here)."""
    source = work / "icudata.c"
    source.write_text("const char icudt70_dat[64] = {0};\n")
    out = work / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", f"-Wl,-soname,{name}", "-o", str(out), str(source)], check=True)
    return out


def _wheel_files(requirement: str, work: Path) -> list[tuple[str, bytes]]:
    """The files of `requirement`'s cp312 manylinux wheel (downloaded from the registry)."""
    import zipfile

    folder = work / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", STUB_PYTHON, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", "-d", str(folder),
                    requirement], check=True)
    name = requirement.split("==")[0].replace("-", "_")
    (wheel,) = folder.glob(f"{name}-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return [(n, z.read(n)) for n in z.namelist() if not n.endswith("/")]


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def carry_site(work: Path) -> Path:
    import google.protobuf
    import pytriton
    import tritonclient

    site = Path(pytriton.__file__).resolve().parent.parent
    server = site / "pytriton" / "tritonserver"
    binaries = {"bin/tritonserver": 0o755, "backends/python/libtriton_python.so": 0o644,
                "backends/python/triton_python_backend_utils.py": 0o644,
                f"python_backend_stubs/{STUB_PYTHON}/triton_python_backend_stub": 0o755}
    out = CARRY / "site.tar.xz"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add(tar, "pytriton/__init__.py", b"")  # tritonpack.server finds the server beside this file
        for name, mode in binaries.items():
            _add(tar, f"pytriton/tritonserver/{name}", (server / name).read_bytes(), mode)
        for lib in _pytriton_libraries([server / n for n, mode in binaries.items() if mode == 0o755]
                                       + [server / "backends/python/libtriton_python.so"]):
            path = _icu_data_stub(lib.name, work) if lib.name.startswith("libicudata") else lib
            _add(tar, f"nvidia_pytriton.libs/{lib.name}", path.read_bytes(), 0o755)
        # Triton's model-config schema without the rest of tritonclient (its grpc client needs a newer grpcio)
        client = Path(tritonclient.__file__).parent
        _add(tar, "tritonclient/__init__.py", (client / "__init__.py").read_bytes())
        _add(tar, "tritonclient/grpc/__init__.py", b"")
        _add(tar, "tritonclient/grpc/model_config_pb2.py", (client / "grpc" / "model_config_pb2.py").read_bytes())
        for requirement in (f"protobuf=={google.protobuf.__version__}", "isal==1.9.1"):
            for name, data in _wheel_files(requirement, work):
                _add(tar, name, data, 0o755 if name.endswith(".so") else 0o644)
        for name, data in _wheel_files(f"numpy=={np.__version__}", work):
            if not STUB_NUMPY_UNUSED.search(name):
                _add(tar, f"{STUB_NUMPY}/{name}", data, 0o755 if ".so" in name else 0o644)
    # x86 machine code compresses 5 % smaller through xz's branch filter: what fits the transfer limit
    out.write_bytes(lzma.compress(buffer.getvalue(), filters=[{"id": lzma.FILTER_X86}, {
        "id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]))
    return out


def carry_model(model: Path) -> Path:
    """The model folder with its weights as fp16 in two byte planes (xz packs the exponents' plane well)."""
    import safetensors.torch

    weights = safetensors.torch.load_file(str(model / "model.safetensors"))
    fp16 = np.frombuffer(safetensors.torch.save({k: v.half() for k, v in weights.items()}), np.uint8)
    even = len(fp16) - len(fp16) % 2
    planes = fp16[:even].reshape(-1, 2).T.tobytes() + fp16[even:].tobytes()
    out = CARRY / "minilm.tar.xz"
    with tarfile.open(out, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for path in sorted(model.rglob("*")):
            if path.is_file() and path.name != "model.safetensors" and path.suffix != ".md":
                _add(tar, f"minilm/{path.relative_to(model)}", path.read_bytes())
        _add(tar, "minilm/model.fp16-planes", planes)
    return out


def widen(planes: bytes) -> dict:
    """fp16 byte planes → the fp32 tensors `carry_model` started from, rounded to fp16."""
    import safetensors.torch

    raw = np.frombuffer(planes, np.uint8)
    half = (len(raw) // 2)
    interleaved = np.empty(len(raw), np.uint8)
    interleaved[:2 * half] = raw[:2 * half].reshape(2, half).T.reshape(-1)
    interleaved[2 * half:] = raw[2 * half:]
    return {k: v.float() for k, v in safetensors.torch.load(interleaved.tobytes()).items()}


def carry_reference(model: Path) -> Path:
    """Timed corpus and held-out texts, with sentence-transformers' fp32 embeddings of the held-out ones on this CPU
    from the original weights (the fp16 rounding of the carried weights moves them by a cosine of 1e-6 at most)."""
    from sentence_transformers import SentenceTransformer

    from benchmarks import corpus

    timed = corpus.corpus(TIMED_SENTENCES)
    held = corpus.held_out(HELD_OUT, timed=timed)
    original = SentenceTransformer(str(model), device="cpu").encode([s.text for s in held], batch_size=32,
                                                                     normalize_embeddings=True)
    arrays = io.BytesIO()
    np.savez(arrays, timed=np.array([s.text for s in timed]), held=np.array([s.text for s in held]), original=original)
    out = CARRY / "reference.npz.xz"
    out.write_bytes(lzma.compress(arrays.getvalue(), preset=9))
    return out


def load_reference() -> dict:
    return dict(np.load(io.BytesIO(lzma.decompress((CARRY / "reference.npz.xz").read_bytes()))))


def carry() -> None:
    from benchmarks import corpus

    CARRY.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        paths = [carry_site(Path(work)), carry_model(corpus.model_path()), carry_reference(corpus.model_path())]
    for path in paths:
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size / 1e6:.1f} MB")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    checkout = [ROOT / name for name in tracked.split("\0") if name and (ROOT / name).exists()]
    on_disk = sum(p.stat().st_blocks * 512 for p in [*paths, *checkout])
    print(f"with the checkout's files {on_disk / 2**20:.2f} MiB on disk, of the 64 MiB a device call carries (it "
          f"counts disk blocks)")


# ---- there --------------------------------------------------------------------------------------------------------

def unpack(work: Path) -> tuple[Path, Path]:
    """site-packages additions and the fp32 model folder under `work`."""
    import safetensors.torch

    for name in ("site.tar.xz", "minilm.tar.xz"):
        with tarfile.open(CARRY / name) as tar:
            tar.extractall(work / ("site" if name.startswith("site") else ""), filter="fully_trusted")
    model = work / "minilm"
    planes = model / "model.fp16-planes"
    safetensors.torch.save_file(widen(planes.read_bytes()), str(model / "model.safetensors"))
    planes.unlink()
    return work / "site", model


class Client:
    """Triton's HTTP protocol, the texts as serialized BYTES after the JSON header and the embeddings back as binary
    (as tritonclient sends them; its HTTP client's gevent stack is not on the lent machine), one keep-alive
    connection."""

    def __init__(self, url: str, model: str):
        self.connection = http.client.HTTPConnection(url, timeout=120)
        self.path = f"/v2/models/{model}/infer"

    def embed(self, texts: list[str]) -> np.ndarray:
        data = b"".join(len(b).to_bytes(4, "little") + b for b in (t.encode() for t in texts))
        header = json.dumps({
            "inputs": [{"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(data)}}],
            "outputs": [{"name": "EMBEDDING", "parameters": {"binary_data": True}}]}).encode()
        self.connection.request("POST", self.path, header + data, {
            "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))})
        response = self.connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {body[:300]!r}")
        offset = int(response.getheader("Inference-Header-Content-Length"))
        return np.frombuffer(body[offset:], np.float32).reshape(len(texts), -1)

    def close(self) -> None:
        self.connection.close()


class ProcessClients:
    """ConcurrentClients spread over `processes` client processes, each with its share of the concurrency and of the
    requests: 64 client threads in one Python process share its GIL, which may bound what they send (the c=64
    plateau of docs/performance.md, forty-second round). The run's seconds span the first start to the last end."""

    def __init__(self, url: str, model: str, processes: int):
        context = multiprocessing.get_context("spawn")  # the parent may hold threads: no fork
        self._pipes = []
        self._processes = []
        for _ in range(processes):
            ours, theirs = context.Pipe()
            process = context.Process(target=_client_process, args=(theirs, url, model), daemon=True)
            process.start()
            self._pipes.append(ours)
            self._processes.append(process)

    def send(self, requests: list[list[str]], concurrency: int) -> tuple[Run, list[np.ndarray]]:
        used = self._pipes[:min(len(self._pipes), concurrency)]
        for i, pipe in enumerate(used):
            pipe.send((requests[i::len(used)], concurrency // len(used) + (i < concurrency % len(used))))
        answers = [pipe.recv() for pipe in used]
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        starts, ends, latencies, shares = zip(*answers)
        results: list = [None] * len(requests)
        for i, share in enumerate(shares):
            results[i::len(used)] = share
        return Run(sum(len(r) for r in requests), max(ends) - min(starts),
                   [ms for part in latencies for ms in part]), results

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # a client process that died has closed its end
                pipe.send(None)
        for process in self._processes:
            process.join(timeout=10)


def _client_process(pipe, url: str, model: str) -> None:
    clients = ConcurrentClients(lambda: Client(url, model))
    try:
        while (task := pipe.recv()) is not None:
            requests, concurrency = task
            start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across the client processes
            try:
                run, results = clients.send(requests, concurrency)
                pipe.send((start, time.perf_counter(), run.latencies_ms, results))
            except Exception as e:  # noqa: BLE001 - raised in the parent
                pipe.send(RuntimeError(f"client process: {type(e).__name__}: {e}"))
    finally:
        clients.close()


PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def model_statistics(url: str) -> dict[str, dict[str, int]]:
    """Triton's cumulative statistics of every model (GET /v2/models/stats): requests, sentences (batch elements)
    and executions, and the nanoseconds of each phase summed over requests (every request of a batch is charged
    its batch's whole compute)."""
    connection = http.client.HTTPConnection(url, timeout=30)
    try:
        connection.request("GET", "/v2/models/stats")
        stats = json.loads(connection.getresponse().read())["model_stats"]
    finally:
        connection.close()
    return {m["name"]: {"requests": m["inference_stats"]["success"]["count"], "sentences": m["inference_count"],
                        "executions": m["execution_count"], "request_ns": m["inference_stats"]["success"]["ns"],
                        **{f"{p}_ns": m["inference_stats"][p]["ns"] for p in PHASES}} for m in stats}


def settled_statistics(url: str, quiet_s: float = 0.05, timeout_s: float = 5.0) -> dict[str, dict[str, int]]:
    """model_statistics once two reads `quiet_s` apart agree: Triton counts a step's request when its execution
    ends, which can be just after the client had the ensemble's answer (6 of 300 reads here counted a request late)."""
    deadline = time.monotonic() + timeout_s
    stats = model_statistics(url)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = model_statistics(url)
        if again == stats:
            break
        stats = again
    return stats


def where_time_went(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Each model's part of the requests between two `model_statistics`: sentences per execution, and per request
    the milliseconds in the model, queued and in each compute phase (a phase's time is its batch's)."""
    spent = {}
    for name, a in after.items():
        b = before.get(name, dict.fromkeys(a, 0))
        requests, executions = a["requests"] - b["requests"], a["executions"] - b["executions"]
        if not requests or not executions:
            continue
        spent[name] = {"requests": requests,
                       "sentences_per_execution": round((a["sentences"] - b["sentences"]) / executions, 2),
                       **{f"{p}_ms": round((a[f"{p}_ns"] - b[f"{p}_ns"]) / requests / 1e6, 3)
                          for p in ("request", *PHASES)}}
    return spent


def in_process(model: Path, reference: dict, precisions: tuple[str, ...], repetitions: int) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    texts = list(reference["timed"])
    results = {}
    st = SentenceTransformer(str(model), device="cuda")
    for precision in precisions:
        if precision == "fp16":
            st.half()
        # warm-up of every shape: the allocator and cuBLAS's choice per shape (fp16's first pass ran 9x slower)
        st.encode(texts, batch_size=64)
        runs = []
        for _ in range(repetitions):
            torch.cuda.synchronize()
            t = time.perf_counter()
            st.encode(texts, batch_size=64, normalize_embeddings=True)
            torch.cuda.synchronize()
            runs.append(Run(len(texts), time.perf_counter() - t))
        held = st.encode(list(reference["held"]), batch_size=64, normalize_embeddings=True)
        results[precision] = {**side_summary(runs), "min_cosine": cosine_min(held, reference["original"])}
    del st
    torch.cuda.empty_cache()
    return results


def encoder_direct(repository: Path, model: Path, reference: dict, repetitions: int) -> dict:
    """The served encoder's own session (`torchscript_session`, as its stub runs it) called in this process, one
    sentence's tokens at a time and 32 at a time: what a call costs without Triton, against the eager transformers
    model on the same tokens."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from tritonpack.spec import parse_config

    encoder = repository / "bert_pt_encoder"
    params = {k: v.string_value for k, v in parse_config((encoder / "config.pbtxt").read_text()).parameters.items()}
    sys.path.insert(0, str(ROOT / "models" / "framework_runner"))
    from torchscript_session import open_session

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    texts = list(reference["timed"])
    singles = [dict(tokenizer([t], return_tensors="np")) for t in texts[:SINGLE_CLIENT_SENTENCES]]
    batches = [dict(tokenizer(texts[i:i + 32], padding=True, return_tensors="np")) for i in range(0, len(texts), 32)]
    eager = AutoModel.from_pretrained(str(model)).to("cuda" if torch.cuda.is_available() else "cpu").eval()

    def eager_run(inputs: dict) -> dict:
        with torch.inference_mode():
            out = eager(**{k: torch.from_numpy(v).to(eager.device) for k, v in inputs.items()})
        return {"token_embeddings": out.last_hidden_state.cpu().numpy()}

    def timed(run, calls: list[dict]) -> dict:
        first = time.perf_counter()
        for inputs in calls:
            run(inputs)
        first = time.perf_counter() - first
        runs = []
        for _ in range(repetitions):
            t = time.perf_counter()
            for inputs in calls:
                run(inputs)
            runs.append(time.perf_counter() - t)
        return {"first_pass_ms_per_call": 1e3 * first / len(calls),
                "ms_per_call": 1e3 * float(np.median(runs)) / len(calls)}

    run = open_session(str(encoder / "1" / params["artifact"]), params)
    return {side: {"single": timed(call, singles), "of_32": timed(call, batches)}
            for side, call in (("eager", eager_run), ("torchscript", run))}


def nvidia_smi(query: str) -> str:
    """nvidia-smi's CSV answer to `query`; "" where it is not installed (a rehearsal of the run on a CPU machine)."""
    try:
        return subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True,
                              text=True).stdout.strip()
    except FileNotFoundError:
        return ""


def gpu_memory_mb() -> dict[str, float]:
    out = nvidia_smi("--query-compute-apps=pid,used_memory")
    return {line.split(",")[0].strip(): float(line.split(",")[1]) for line in out.splitlines() if "," in line}


def stub_python(work: Path, site: Path) -> dict[str, str]:
    """The environment that gives tritonserver's stubs this Python with numpy 1 before its own packages: a venv
    whose site-packages holds the carried numpy and a .pth naming this Python's package folders. {} where this
    Python's numpy is 1 already."""
    if int(np.__version__.split(".")[0]) < 2:
        return {}
    venv = work / "stub-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (packages,) = venv.glob("lib/python3*/site-packages")
    for path in (site / STUB_NUMPY).iterdir():
        shutil.move(str(path), packages / path.name)
    folders = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (packages / "zz-this-python.pth").write_text("\n".join(folders) + "\n")
    return {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def served(repository: Path, reference: dict, concurrencies: tuple[int, ...], repetitions: int, out: Path,
           label: str, env: dict[str, str], client_processes: int = 1) -> dict:
    from tritonpack.server import TritonServer

    texts = list(reference["timed"])
    singles = [[t] for t in texts]
    result: dict = {"by_concurrency": {}}
    server = TritonServer(repository, log_path=out / f"tritonserver-{label}.log", keep_log=True, env=env)
    t = time.perf_counter()
    server.start()
    result["ready_s"] = time.perf_counter() - t

    clients = None

    def timed(requests: list[list[str]], c: int) -> dict:
        before = settled_statistics(server.url)
        summary = side_summary([clients.send(requests, c)[0] for _ in range(repetitions)])
        return {**summary, "models": where_time_went(before, settled_statistics(server.url))}

    try:
        clients = ProcessClients(server.url, "bert_pt", client_processes) if client_processes > 1 else \
            ConcurrentClients(lambda: Client(server.url, "bert_pt"))
        held = clients.send([[text] for text in reference["held"]], 1)[1]
        result["min_cosine"] = cosine_min(np.concatenate(held), reference["original"])
        clients.send(singles[:256], 8)  # warm-up
        for c in concurrencies:
            result["by_concurrency"][c] = timed(singles[:SINGLE_CLIENT_SENTENCES] if c == 1 else singles, c)
            print(f"  {label} c={c}: {result['by_concurrency'][c]}", flush=True)
        result["requests_of_32"] = {1: timed([texts[i:i + 32] for i in range(0, len(texts), 32)], 1)}
        result["gpu_memory_mb"] = gpu_memory_mb()
        time.sleep(IDLE_WAIT_S)
        result["gpu_memory_idle_mb"] = gpu_memory_mb()
    finally:
        if clients is not None:
            clients.close()
        server.stop()
    return result


def build(model: Path, dist: Path, serving: list[str], out: Path) -> float:
    """tritonpack's own build of bert_pt portable into `dist` (its artifact cache there is shared by both builds)."""
    t = time.perf_counter()
    args = [sys.executable, "-m", "tritonpack.cli", "build", "bert_pt", "--target", "portable", "--no-env",
            "--model", str(model), "--dist", str(dist)]
    for setting in serving:
        args += ["--serving", setting]
    with open(out / "build.log", "a") as log:
        subprocess.run(args, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return time.perf_counter() - t


def machine() -> dict:
    import torch

    gpu = nvidia_smi("--query-gpu=name,driver_version,memory.total") or "none (nvidia-smi not found)"
    return {**meters.machine(), "gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda}


def libpython_folders() -> list[str]:
    """Where this Python's shared library is, for the stub that embeds it (none: the loader's default search)."""
    import sysconfig

    name = f"libpython{STUB_PYTHON}.so.1.0"
    return [folder for folder in (sysconfig.get_config_var("LIBDIR"), f"{sys.base_prefix}/lib")
            if folder and (Path(folder) / name).exists()][:1]


def run(out: Path, concurrency: tuple[int, ...], repetitions: int, precisions: tuple[str, ...],
        skip: set[str] = frozenset(), serving: list[str] = (), client_processes: int = 1) -> dict:
    """Each stage's results are written to OUT/gpu.json as they come; a stage that fails is recorded, not fatal. What
    it unpacks and builds (~450 MB) is removed at the end."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-run-", ignore_cleanup_errors=True) as folder:
        return _run_stages(Path(folder), out, concurrency, repetitions, precisions, skip, list(serving),
                           client_processes)


def _run_stages(work: Path, out: Path, concurrency: tuple[int, ...], repetitions: int,
                precisions: tuple[str, ...], skip: set[str], serving: list[str], client_processes: int) -> dict:
    t = time.perf_counter()
    site, model = unpack(work)
    sys.path[:0] = [str(site)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT / "src"), str(ROOT),
                                                os.environ.get("PYTHONPATH", "")])
    # the python backend's stub embeds this Python: it loads libpython from where this interpreter's install keeps it
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([*libpython_folders(), os.environ.get("LD_LIBRARY_PATH", "")])
    os.environ["TRITONPACK_CACHE"] = str(work / "cache")
    stub_env = stub_python(work, site)
    report: dict = {"machine": machine(), "unpack_s": time.perf_counter() - t, "stub_numpy_1": bool(stub_env),
                    "serving": serving, "client_processes": client_processes}
    print(json.dumps(report["machine"]), flush=True)
    reference = load_reference()
    dist = work / "dist"
    repository = dist / "bert_pt-portable"
    stages = {
        "in_process": lambda: in_process(model, reference, precisions, repetitions),
        "build_s": lambda: build(model, dist, serving, out),
        "encoder_direct": lambda: encoder_direct(repository, model, reference, repetitions),
        "served_batching": lambda: served(repository, reference, concurrency, repetitions, out, "batching", stub_env,
                                          client_processes),
        "build_unbatched_s": lambda: build(model, dist, [*serving, "dynamic_batching=false"], out),
        "served_unbatched": lambda: served(repository, reference, tuple(c for c in concurrency if c >= 8),
                                           repetitions, out, "unbatched", stub_env, client_processes),
    }
    for name, stage in stages.items():
        if name in skip:
            continue
        try:
            report[name] = stage()
        except Exception as e:  # noqa: BLE001 - the stages after it may still run; the report says what failed
            report[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"{name}: {report[name]}", flush=True)
        (out / "gpu.json").write_text(json.dumps(report, indent=1, default=str))
        if name == "build_s" and repository.is_dir():
            shutil.copy2(repository / "bert_pt_encoder" / "config.pbtxt", out / "encoder-config.pbtxt")
    return report


def summary(report: dict) -> str:
    lines = [json.dumps(report["machine"])]
    fp32 = report.get("in_process", {}).get("fp32", {}).get("throughput_median")
    lines.append(f"in-process sentence-transformers b64: {report.get('in_process')}")
    for label in ("served_batching", "served_unbatched"):
        s = report.get(label, {})
        if "error" in s or not s:
            lines.append(f"{label}: {s}")
            continue
        lines.append(f"{label}: ready {s['ready_s']:.1f} s, min cosine {s['min_cosine']:.6f}, "
                     f"GPU MiB by pid {s['gpu_memory_mb']}, idle {s.get('gpu_memory_idle_mb')}")
        for c, r in s["by_concurrency"].items():
            versus = f" ({r['throughput_median'] / fp32:.2f}x fp32 in-process)" if fp32 else ""
            lines.append(f"  c={c}: {r['throughput_median']:.0f}/s{versus} p50 {r['latency_p50_ms']:.1f} ms "
                         f"p99 {r['latency_p99_ms']:.1f} ms")
            lines += [f"    {name}: {times}" for name, times in r.get("models", {}).items()]
        for c, r in s.get("requests_of_32", {}).items():
            lines.append(f"  32 per request c={c}: {r['throughput_median']:.0f}/s p50 {r['latency_p50_ms']:.1f} ms")
    for mode, times in report.get("encoder_direct", {}).items():
        lines.append(f"encoder in-process, {mode}: {times}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("carry")
    there = sub.add_parser("run")
    there.add_argument("out", type=Path)
    there.add_argument("--concurrency", default="1,4,8,16,64", help="served concurrencies (default: %(default)s)")
    there.add_argument("--repetitions", type=int, default=3)
    there.add_argument("--precisions", default="fp32,fp16", help="in-process sentence-transformers on the GPU")
    there.add_argument("--serving", action="append", default=[], metavar="KEY=VALUE",
                       help="serving settings for both builds, as tritonpack build takes them (repeatable)")
    there.add_argument("--client-processes", type=int, default=1,
                       help="processes the served clients are spread over (default: %(default)s, threads only)")
    there.add_argument("--skip", default="", help="stages not to run, comma-separated (in_process, encoder_direct, "
                                                  "build_unbatched_s, served_unbatched, ...)")
    args = parser.parse_args(argv)
    if args.command == "carry":
        carry()
    else:
        print(summary(run(args.out, tuple(int(c) for c in args.concurrency.split(",")), args.repetitions,
                          tuple(args.precisions.split(",")), set(filter(None, args.skip.split(","))), args.serving,
                          args.client_processes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
