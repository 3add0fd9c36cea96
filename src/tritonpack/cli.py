"""`tritonpack` command line: build, serve, check, infer, mme, env, upload, deploy, bench."""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import itertools
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tritonpack.aws import endpoint_url
from tritonpack.containers import DEFAULT_CONTAINER
from tritonpack.contracts import TEXT, IoNames
from tritonpack.errors import ServerError, ToolUnavailable, TritonpackError, UserError, disk_full

if TYPE_CHECKING:
    from tritonpack.server import TritonServer

# Modules that add their own subcommand with `add_command(subparsers)`.
COMMAND_MODULES: tuple[str, ...] = ("tritonpack.mme", "tritonpack.check", "tritonpack.env", "tritonpack.aws")
DEMO_TEXTS = ["tritonpack turns notebooks into Triton repositories.", "A second, unrelated sentence."]
PORT_OPTIONS = ("http_port", "grpc_port", "metrics_port")  # what `serve` may be asked to listen on


def cmd_build(args) -> int:
    from tritonpack.builder import BuildRequest, build, default_target, portable_on_gpu_hint
    from tritonpack.check import check

    malformed = [kv for kv in args.serving or () if "=" not in kv]
    if malformed:
        raise UserError(f"--serving {malformed[0]!r}: write KEY=VALUE, e.g. --serving dynamic_batching=false")
    target, chosen = args.target, None
    if not target:
        target, chosen = default_target()
    serving = tuple(tuple(kv.split("=", 1)) for kv in args.serving or ())
    io_names = IoNames.parse(args.io_names) if args.io_names else None
    plans = tuple(tuple(p.split("=", 1)) if "=" in p else ("", p) for p in args.plan or ())
    request = BuildRequest(args.name, target, model=args.model, weights=args.weights, fp16=args.fp16,
                           model_format=args.model_format, env=args.env, container=args.container,
                           env_python=args.env_python, io_names=io_names, plans=plans, dist=Path(args.dist),
                           serving=serving)
    try:
        result = build(request)
    except ToolUnavailable:  # the chosen target needs it: say why that target was chosen; other errors stand alone
        if chosen:
            print(chosen, file=sys.stderr)
        raise
    for line in (chosen, portable_on_gpu_hint(request)):
        if line:
            print(line, file=sys.stderr)
    (Path(args.dist) / f".{args.name}.target").write_text(target + "\n")  # what `make serve/check/mme` use
    print(f"repository: {result.repository}\ntarball:    {result.tarball}", flush=True)
    report = check(result.tarball, deep=True)
    for line in [*report.problems, *(f"warning: {w}" for w in report.warnings),
                 *(f"not checked: {u}" for u in report.unchecked)]:
        print(line, file=sys.stderr)
    if report.ok:
        print(f"check:      ok ({len(report.models)} models, entry {report.ensemble})", flush=True)
    else:  # the local repository still serves; the lines above say what the target container would refuse
        print(f"check:      {result.tarball.name} would not load on the target container: "
              f"{len(report.problems)} problem(s) above", flush=True)
    if args.smoke:
        args.repository, args.http_port, args.grpc_port, args.metrics_port = result.repository, 0, 0, 0
        return cmd_serve(args)
    return 0


def repository_entry(repo: Path):
    """(ensemble config, its public tensor names) of a built repository."""
    from tritonpack.spec import parse_config

    for config in sorted(Path(repo).glob("*/config.pbtxt")):
        cfg = parse_config(config.read_text())
        if cfg.platform == "ensemble":
            return cfg, IoNames(cfg.input[0].name, cfg.output[0].name)
    raise UserError(f"{repo}: no ensemble found (a folder whose config.pbtxt says platform: \"ensemble\")")


def demo_request(url: str, repo: Path) -> None:
    from tritonpack.spec import mc

    ensemble, io = repository_entry(repo)
    if ensemble.input[0].data_type == mc.TYPE_STRING:
        from tritonpack.client import embed

        vectors = embed(url, ensemble.name, DEMO_TEXTS, io=io)
        for text, vector in zip(DEMO_TEXTS, vectors):
            print(f"{ensemble.name}: {text!r} → {io.output} {vector.shape} "
                  f"[{', '.join(f'{v:.4f}' for v in vector[:4])}, …]")
        print(f"cosine(first, second) = {float(vectors[0] @ vectors[1]):.4f}")
    else:
        from tritonpack.client import classify, sample_image

        for label in classify(url, ensemble.name, [sample_image()], class_count=3, io=io)[0]:
            print(f"{ensemble.name}: sample image → {label}")


def build_hint(repository: Path) -> str:
    """The command that builds `repository` (a folder or its tarball), where its name says which ensemble and
    target it is."""
    from tritonpack.ensembles import NAMES, recipe

    name, _, target = repository.name.removesuffix(".tar.gz").rpartition("-")
    if name in NAMES and target in recipe(name).targets:
        return f"`make build NAME={name} TARGET={target}` builds it"
    if name in NAMES:
        return f"{name} builds for {', '.join(recipe(name).targets)}, not {target!r}"
    return f"`make build NAME=bert` builds one into dist/bert-portable (ensembles: {', '.join(NAMES)})"


def cmd_serve(args) -> int:
    from tritonpack.server import native_backends, port_taken

    asked = [(option, port) for option in PORT_OPTIONS if (port := getattr(args, option))]
    for (first, port), (second, other) in itertools.combinations(asked, 2):
        if port == other:  # Triton's refusal came after ~30 lines of its usage text
            raise UserError(f"{_flag(first)} and {_flag(second)} both ask for port {port}: give each its own, or 0 for "
                            f"a free one")
    repository = Path(args.repository)
    if repository.is_file():
        raise UserError(f"{repository} is a file: `serve` takes a repository folder (dist/bert-portable); a tarball "
                        f"is served by the local MME: `tritonpack mme --models {repository.parent}`")
    if not repository.is_dir():
        raise UserError(f"{repository}: no such repository folder; {build_hint(repository)}")
    refuse_what_would_not_load(repository)
    needed, gpu = native_backends(repository)
    if needed:  # the bundled Triton has only the python backend: say where the repository does run
        print(f"{args.repository} needs Triton's {', '.join(needed)} backend{'s' * (len(needed) > 1)}, which the "
              f"local Triton (python backend only) lacks; {container_serving(repository, 'gpu' if gpu else 'cpu')}",
              flush=True)
        return 0
    for option, port in asked:  # before tritonserver starts: another one there would answer its readiness
        if port_taken(port):
            raise UserError(taken_by_another_process(_flag(option), port))
    with startable_by_the_python_backend(repository) as startable:
        return serve(args, startable)


def container_serving(repository: Path, target: str) -> str:
    """How to serve `repository` in the Triton container: its tarball extracted (`docker_command`), which carries
    what the container's Python lacks, built again first where it is gone; a repository tritonpack did not build
    (no manifest) mounted as it is."""
    from tritonpack.containers import built_for, docker_command, docker_run

    container, tarball = built_for(repository), repository.with_name(f"{repository.name}.tar.gz")
    if tarball.is_file():
        return f"serve it with: {docker_command(repository, target, container)}"
    if not (repository / "manifest.json").is_file():
        return f"serve it with: {docker_run(repository, target, container)}"
    return (f"its tarball {tarball} is gone: build it again as before ({build_hint(repository)}), then serve it "
            f"with: {docker_command(repository, target, container)}")


@contextmanager
def startable_by_the_python_backend(repository: Path):
    """`repository`, or where its path holds characters Triton's python backend cannot start a stub from (it passes
    the model's path unquoted to a shell), a copy of it in a temporary folder, removed afterwards."""
    from tritonpack.server import stub_path_problem

    problem = stub_path_problem(repository)
    if problem is None:
        yield repository
        return
    with tempfile.TemporaryDirectory(prefix="tritonpack-serve-") as folder:
        if stub_path_problem(Path(folder)):
            raise UserError(f"{repository}: {problem}; `serve` would serve a copy from the temporary folder, but "
                            f"{folder} holds them too: set TMPDIR to a folder without them")
        copy = Path(shutil.copytree(repository, Path(folder) / "repository"))
        print(f"serving a copy in {copy}: Triton's python backend cannot start a stub from {repository.resolve()} "
              f"(a space or a shell character in its path)", flush=True)
        yield copy


def serve(args: argparse.Namespace, repository: Path) -> int:
    """Serve `repository` in the bundled tritonserver until a stop signal (or one demo request with `--smoke`). The
    log stays for a server that serves until stopped; a clean `--smoke` run removes its folder."""
    from tritonpack.server import PortInUse, TritonServer

    server = TritonServer(repository, http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, keep_log=not args.smoke)
    print(f"starting tritonserver on http://{server.url} (grpc {server.grpc_port}, metrics {server.metrics_port}); "
          f"log: {server.log_path}", flush=True)
    try:
        with stopped_by_signals(), server:
            print("ready", flush=True)
            if args.smoke:
                smoke_request(server, repository)
                return 0
            wait_for_stop(lambda: server.process.poll() is None)
            if server.process.returncode is not None:
                raise ServerError(f"tritonserver exited with {server.process.returncode}; log: {server.log_path}")
            print("stopping", flush=True)
    except KeyboardInterrupt:  # while it was loading: start() stopped it
        print("interrupted before tritonserver was ready; stopped", file=sys.stderr)
        return 130
    except PortInUse as e:
        option = port_option(args, e.port)
        if option is None:  # a free port chosen here, and taken since
            raise
        raise UserError(f"{taken_by_another_process(option, e.port)}; log: {server.log_path}") from None
    return 0


def taken_by_another_process(option: str, port: int) -> str:
    return f"{option} {port} is taken by another process: choose another {option}, or 0 for a free one"


def smoke_request(server: TritonServer, repository: Path) -> None:
    """`--smoke`'s demo request to `server`; one that fails keeps the server's log, and the error names it."""
    from tritonclient.utils import InferenceServerException

    try:
        demo_request(server.url, repository)
    except InferenceServerException as e:
        server.keep_log = True
        said = (e.message() or str(e)).partition("\n")[0].strip()  # a model's Python traceback follows
        raise ServerError(f"the smoke request failed: {said}; log: {server.log_path}") from None
    except BaseException:
        server.keep_log = True
        raise


def port_option(args: argparse.Namespace, port: int) -> str | None:
    """The option of `serve` that asked for `port`, or None."""
    given = [option for option in PORT_OPTIONS if getattr(args, option) == port]
    return _flag(given[0]) if given else None


def _flag(option: str) -> str:
    """An argparse destination as its command-line option: http_port → --http-port."""
    return "--" + option.replace("_", "-")


def refuse_what_would_not_load(repository: Path) -> None:
    """`check --local`'s structural checks before tritonserver starts: a folder that is not a model repository (or
    one Triton would refuse) is said in one line, not in tritonserver's log after a start that fails or serves
    nothing."""
    from tritonpack.check import check
    from tritonpack.server import PYTHON_VERSION, local_server_python

    report = check(repository, python=PYTHON_VERSION, server=local_server_python())
    if report.problems:
        more = f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise UserError(f"{repository} would not load: {report.problems[0]}{more}; `tritonpack check {repository} "
                        f"--local` lists every problem")


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(*_) -> None:
    """The first stop signal interrupts; those after it are ignored, so that stopping runs to its end."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextmanager
def stopped_by_signals():
    """Ctrl-C, `kill` and a closed terminal raise KeyboardInterrupt inside, starting included (SIGHUP's default ends
    Python without any cleanup, and tritonserver, in a session of its own, would run on); the handlers before come
    back after."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_for_stop(running: Callable[[], bool]) -> None:
    """Wait while `running()` until a stop signal, then ignore further ones: stopping runs to its end (calls
    drained, stubs reaped, /dev/shm regions removed)."""
    try:
        while running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def cmd_infer(args) -> int:
    from tritonpack.client import served_embeddings

    texts = list(args.texts)
    if args.file:
        if Path(args.file).is_dir():
            raise UserError(f"--file {args.file}: a folder; --file takes a text file, one text per line")
        if not Path(args.file).is_file():
            raise UserError(f"--file {args.file}: no such file")
        try:
            lines = Path(args.file).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise UserError(f"--file {args.file}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") \
                from None
        if not lines and not texts:
            raise UserError(f"--file {args.file}: no lines; write one text per line")
        texts += lines
    if not texts:
        raise UserError("give texts as arguments or --file")
    if args.mme:  # a SageMaker multi-model endpoint (local `tritonpack mme` or real) through boto3
        from tritonpack.payloads import embed_texts

        if not args.target_model:
            raise UserError("--mme needs --target-model (the tarball to invoke)")
        from tritonpack.aws import aws_errors

        io = IoNames.parse(args.io_names) if args.io_names else TEXT
        try:  # the endpoint's refusal is the server's answer, exit status 1, as `--url`'s
            with aws_errors(f"invoke {args.target_model}", refused=TritonpackError):
                vectors = embed_texts(texts, args.target_model, fmt=args.format, endpoint_name=args.endpoint_name,
                                      endpoint_url=None if args.mme == "aws" else args.mme, io=io)
        except TritonpackError as e:
            hint = None if isinstance(e, UserError) else io.renamed_hint(str(e))
            if hint is None:
                raise
            raise TritonpackError(f"{e}; {hint}") from None
        args.model = args.target_model
    else:
        vectors = served_embeddings(args.url, args.model, texts)
    if args.json:
        json.dump({"model": args.model, "embeddings": vectors.tolist()}, sys.stdout)
        print()
        return 0
    print(f"{args.model}: {vectors.shape[0]} embeddings of {vectors.shape[1]} floats")
    for text, vector in zip(texts, vectors):
        print(f"  [{', '.join(f'{v:+.4f}' for v in vector[:4])}, …]  {text[:60]!r}")
    return 0


def cmd_bench(args) -> int:
    """The benchmarks live beside the product in a checkout (`benchmarks/`), not in the installed package."""
    from tritonpack import CARD_ROOT

    if not (CARD_ROOT / "benchmarks" / "__main__.py").is_file():
        raise UserError("tritonpack bench runs the benchmarks of a repository checkout (benchmarks/ beside src/); "
                        "clone the repository and run `make bench` there")
    return subprocess.call([sys.executable, "-m", "benchmarks", *args.options], cwd=CARD_ROOT)


def port_number(text: str) -> int:
    """argparse type of a TCP port option (0: a free one)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535; 0: a free one)")
    return int(text)


def positive(what: str) -> Callable[[str], int]:
    """argparse type of a count that must be at least 1."""
    def count(text: str) -> int:
        if not text.strip().isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of {what}")
        return int(text)
    return count


class Parser(argparse.ArgumentParser):
    """argparse's parser, saying a mistake on the command line in one line: what was wrong, the closest choice where
    a name was mistyped, and where the options are listed (argparse prints its whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        mistyped = re.search(r"invalid choice: '?(.+?)'? \(choose from (.+)\)$", message)
        close = mistyped and difflib.get_close_matches(
            mistyped[1], [choice.strip("'") for choice in mistyped[2].split(", ")], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        self.exit(2, f"error: {self.prog}: {message}; {hint}`{self.prog} --help` lists the options\n")


def parser() -> argparse.ArgumentParser:
    from tritonpack.components import TARGETS
    from tritonpack.ensembles import NAMES

    p = Parser(prog="tritonpack", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build a versioned Triton repository and its MME tarball into dist/")
    b.add_argument("name", choices=NAMES)
    b.add_argument("--target", choices=TARGETS, help="default: gpu with a CUDA GPU and TensorRT, else portable")
    b.add_argument("--model", help="text ensembles: local sentence-transformers folder or hub id "
                                   "(default: the bundled all-MiniLM-L6-v2)")
    b.add_argument("--weights", help="image ensembles: local weights (resnet: a torchvision .pth state dict or a "
                                      "transformers ResNet folder; dali_inception: a frozen TF graph)")
    b.add_argument("--fp16", action="store_true", help="TensorRT plans in fp16")
    b.add_argument("--serving", action="append", metavar="KEY=VALUE",
                   help="override a serving setting of the recipe, e.g. dynamic_batching=false, encoder_instances=2, "
                        "max_text_bytes=65536 (text), max_image_pixels=50000000 (images; 0: no limit)")
    b.add_argument("--plan", action="append", metavar="[CC=]PATH",
                   help="gpu target: a TensorRT plan built elsewhere instead of building one here; with CC (a compute "
                        "capability such as 8.6) one per GPU architecture, listed in cc_model_filenames (repeat)")
    b.add_argument("--io-names", metavar="INPUT:OUTPUT",
                   help="rename the ensemble's public input and output, e.g. INPUT0:OUTPUT0 for the AWS notebooks' "
                        "client code (default TEXT:EMBEDDING / IMAGE:SCORES)")
    b.add_argument("--model-format", help="dali_inception: graphdef (default; Triton <= 25.02) or onnx (any Triton)")
    b.add_argument("--container",
                   help=f"the Triton container release the MME tarball is for: its packed environment is built for "
                        f"that container's Python (default {DEFAULT_CONTAINER}, the current SageMaker Triton image)")
    b.add_argument("--env-python", help="the target Python instead of --container's, e.g. 3.11 (the local stub's)")
    b.add_argument("--no-env", dest="env", action="store_false",
                   help="no packed environment in the tarball: the server's Python must have what the models import")
    b.add_argument("--dist", default="dist")
    b.add_argument("--smoke", action="store_true", help="then serve it locally and show one real answer")
    b.set_defaults(func=cmd_build)

    s = sub.add_parser("serve", help="serve a repository with the tritonserver bundled in nvidia-pytriton")
    s.add_argument("repository")
    s.add_argument("--http-port", type=port_number, default=0, help="default: a free port")
    s.add_argument("--grpc-port", type=port_number, default=0)
    s.add_argument("--metrics-port", type=port_number, default=0)
    s.add_argument("--smoke", action="store_true", help="send one example request, print the answer, stop")
    s.set_defaults(func=cmd_serve)

    i = sub.add_parser("infer", help="texts → embeddings from a served text ensemble")
    i.add_argument("texts", nargs="*")
    i.add_argument("--file", help="one text per line")
    i.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP host:port")
    i.add_argument("--model", default="bert")
    i.add_argument("--json", action="store_true", help="print all values as JSON")
    i.add_argument("--mme", metavar="URL", type=lambda text: text if text == "aws" else endpoint_url(text),
                   help="invoke a multi-model endpoint through boto3's sagemaker-runtime instead: the local MME's "
                        "URL (http://host:port), or 'aws' for the real SageMaker")
    i.add_argument("--target-model", help="with --mme: the tarball to invoke (X-Amzn-SageMaker-Target-Model)")
    i.add_argument("--endpoint-name", default="local", help="with --mme: the endpoint (default local)")
    i.add_argument("--format", choices=("json", "binary"), default="binary",
                   help="with --mme: request body format (default binary+json)")
    i.add_argument("--io-names", metavar="INPUT:OUTPUT",
                   help="with --mme: the tarball's public tensor names if it was built with --io-names (default "
                        "TEXT:EMBEDDING; without --mme they are read from the server)")
    i.set_defaults(func=cmd_infer)

    n = sub.add_parser("bench", help="served bert side by side with its peers, memory, cold start → dist/bench/",
                       description="Runs `python -m benchmarks` of the checkout (what `make bench` runs); every "
                                   "option after bench goes to it, e.g. tritonpack bench --mode smoke.")
    n.add_argument("options", nargs=argparse.REMAINDER, help="options of python -m benchmarks (--help lists them)")
    n.set_defaults(func=cmd_bench)

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return run_command(parsed(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # Ctrl-C: whatever the command started has stopped on the way out
        print("interrupted", file=sys.stderr)
        return 130


def parsed(argv: list[str]) -> argparse.Namespace:
    """The command line's arguments. `bench` hands every option after it (after a `--`, if one follows it) to the
    benchmarks' own parser: argparse's remainder would claim `--mode smoke` for tritonpack's parser, which has no
    such option."""
    p = parser()
    args, unknown = p.parse_known_args(argv)
    if getattr(args, "func", None) is cmd_bench:
        options = argv[argv.index("bench") + 1:]
        args.options = options[1:] if options[:1] == ["--"] else options
    elif unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def run_command(args: argparse.Namespace) -> int:
    return said_in_one_line(lambda: args.func(args), args)


def run_script(main: Callable[[], int]) -> int:
    """The exit status of a standalone script's `main` (`python -m tritonpack.build.…`), its errors said as the
    command line says them."""
    return said_in_one_line(main, argparse.Namespace())


def said_in_one_line(call: Callable[[], int], args: argparse.Namespace) -> int:
    try:
        return call()
    except UserError as e:  # the user's to fix: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TritonpackError as e:  # an operation that failed; its message names the log
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        said = environment_limit(e, args)
        if said is None:
            raise
        print(f"error: {said}", file=sys.stderr)
        return 2  # a limit of the environment, as a UserError


OUTPUT_OPTIONS = {"dist": "--dist", "out": "--out"}  # a command's option naming the folder it writes, by its dest


def environment_limit(e: OSError, args: argparse.Namespace) -> str | None:
    """The one line for an OSError that is no bug: a full disk, a folder this user may not write (or on a read-only
    file system), a path given that is not there or not theirs; None for any other."""
    written = e.filename2 or e.filename  # shutil's copies and os.rename name the source first, the destination second
    option, output = next(((option, Path(getattr(args, dest))) for dest, option in OUTPUT_OPTIONS.items()
                           if getattr(args, dest, None)), (None, None))
    if disk_full(e):
        return (f"no space left on the device of {existing_above(written or output or Path.cwd())} (nothing partial "
                f"was kept): free space there (`make clean` removes dist/) and run the command again")
    if written is None:
        return None
    in_output = output is not None and Path(written).absolute().is_relative_to(output.absolute())
    if e.errno == errno.EROFS or isinstance(e, PermissionError) and in_output:
        elsewhere = f", or write elsewhere with {option} FOLDER" if output else ""
        return f"cannot write {existing_above(written)}: {e.strerror.lower()}; make it writable{elsewhere}"
    if isinstance(e, (FileExistsError, NotADirectoryError)) and output is not None and output.is_file():
        return f"{option} {output}: a file; {option} takes a folder (made where it is not there)"
    if isinstance(e, (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)):
        return f"{e.filename}: {e.strerror}"  # a path given that is not there or not ours
    return None


def existing_above(path) -> Path:
    """`path`, or the nearest folder above it that exists (the staging folder an error names may be gone)."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return where


if __name__ == "__main__":
    sys.exit(main())
