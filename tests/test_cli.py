"""The `tritonpack` command line: every documented subcommand has --help; infer reads arguments and files."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.small_disk import small_disk
from tritonpack.cli import DEMO_TEXTS, main
from tritonpack.ensembles.text import TextServing

TEXT_SERVING_FIELDS = list(TextServing.__dataclass_fields__)

SUBCOMMANDS = ["build", "serve", "check", "infer", "mme", "upload", "deploy", "env", "bench"]
MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tritonpack.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_cli_prints_usage_when_subcommand_gets_help(command):
    result = run_cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: tritonpack {command}")


@pytest.mark.server
def test_cli_infer_prints_embeddings_when_texts_come_from_args_and_file(served, tmp_path, capsys):
    server = served("bert")
    lines = tmp_path / "texts.txt"
    lines.write_text("from a file\nsecond line\n")
    assert main(["infer", "an argument", "--file", str(lines), "--url", server.url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    vectors = np.array(out["embeddings"])
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert main(["infer", "plain output", "--url", f"http://{server.url}"]) == 0
    assert "bert: 1 embeddings of 384 floats" in capsys.readouterr().out
    # A model the server does not serve: one line naming what it serves (it said only "unknown model")
    assert main(["infer", "text", "--url", server.url, "--model", "no_such_model"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: 'no_such_model' is not served at {server.url} (served: {', '.join(served_models(server))}): pass "
        f"--model NAME"]


def served_models(server) -> list[str]:
    return sorted(path.parent.name for path in Path(server.model_repository).glob("*/config.pbtxt"))


@pytest.mark.server
def test_cli_infer_sends_a_file_longer_than_the_models_batch_in_requests_it_takes(served, tmp_path, capsys):
    """300 lines went as one request of 300 texts: Triton refused it (batch-size must be <= 64)."""
    server = served("bert")
    texts = [f"line number {i} of a long file" for i in range(150)]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    assert main(["infer", "--file", str(tmp_path / "texts.txt"), "--url", server.url, "--json"]) == 0
    vectors = np.array(json.loads(capsys.readouterr().out)["embeddings"])
    assert vectors.shape == (150, 384)
    for row in (0, 64, 149):  # first of each request, and the last
        assert main(["infer", texts[row], "--url", server.url, "--json"]) == 0
        alone = np.array(json.loads(capsys.readouterr().out)["embeddings"][0])
        np.testing.assert_allclose(vectors[row], alone, atol=2e-3)


@pytest.mark.server
def test_cli_infer_says_in_one_line_that_a_model_does_not_take_text(served, capsys):
    server = served("bert_pt")  # portable bert's one step reads text and answers the embedding: bert_pt has two
    for step in ("encoder", "tokenizer"):  # takes token ids; takes text, answers token ids
        model = next(name for name in served_models(server) if step in name)
        assert main(["infer", "text", "--url", server.url, "--model", model]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: {model!r} at {server.url} takes ") and line.endswith(
            ": `infer` sends one text input and reads an FP32 embedding, as an embedding ensemble does (e.g. `make "
            "ensemble NAME=bert`)"), line
        assert " and answers " in line
    assert "(FP32)" not in line  # the tokenizer answers token ids: no embedding


def test_cli_prints_one_line_and_exits_2_when_the_user_asks_for_something_invalid():
    result = run_cli("build", "bert", "--target", "portable", "--serving", "no_such_setting=1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown serving setting 'no_such_setting'; one of " + ", ".join(TEXT_SERVING_FIELDS)]


def closed_port() -> int:
    import socket

    with socket.socket() as sock:  # bound, never listening: a connection is refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


MISTAKES = {  # argv → what the one line says; each used to end in a traceback, a late failure or no error
    "serving without =": (["build", "bert", "--target", "portable", "--serving", "nonsense"],
                          "error: --serving 'nonsense': write KEY=VALUE, e.g. --serving dynamic_batching=false"),
    "no encoder instance": (["build", "bert", "--target", "portable", "--serving", "encoder_instances=0"],
                            "encoder_instances must be at least 1, got 1, 1, 0"),
    "negative threads": (["build", "bert", "--target", "portable", "--serving", "encoder_threads=-1"],
                         "cannot be negative, got -1, "),
    # the whole settings object was printed after these
    "no batch": (["build", "bert", "--target", "portable", "--serving", "max_batch_size=0"],
                 "error: TextServing: max_batch_size must be at least 1, got 0"),
    "negative packing": (["build", "bert", "--target", "portable", "--serving", "encoder_pack_tokens=-1"],
                         "error: TextServing: encoder_pack_tokens must be 0 (no packing) or positive, got -1"),
    "no image batch": (["build", "resnet_pt", "--target", "portable", "--serving", "max_batch_size=0"],
                       "error: ImageServing: max_batch_size must be at least 1, got 0"),
    "model folder missing": (["build", "bert", "--target", "portable", "--model", "{tmp}/missing"],
                             "error: --model {tmp}/missing: not a folder"),
    "hub id offline": (["build", "bert", "--target", "portable", "--model", "no-such-org/no-such-model"],
                       "error: --model no-such-org/no-such-model: not a local folder, and the hub could not give it"),
    "weights for text": (["build", "bert", "--target", "portable", "--weights", "w.pt"],
                         "error: bert is a text ensemble: --weights is for image ensembles (bert takes --model, a "
                         "sentence-transformers folder)"),
    "format for text": (["build", "bert", "--target", "portable", "--model-format", "onnx"],
                        "error: bert is a text ensemble: --model-format is for image ensembles"),
    "model for images": (["build", "resnet_pt", "--target", "portable", "--model", "m"],
                         "error: resnet_pt is an image ensemble: --model is for text ensembles (resnet_pt takes "
                         "--weights, a checkpoint file or folder)"),
    "weights missing": (["build", "resnet_pt", "--target", "portable", "--weights", "{tmp}/w.pt"],
                        "error: --weights {tmp}/w.pt: no such file or folder"),
    "repository missing": (["serve", "{tmp}/missing"], "error: {tmp}/missing: no such repository folder; `make "
                                                       "build NAME=bert` builds one into dist/bert-portable"),
    "ensemble not built": (["serve", "{tmp}/dali_inception-portable"],
                           "no such repository folder; `make build NAME=dali_inception TARGET=portable` builds it"),
    "texts file missing": (["infer", "--file", "{tmp}/texts.txt"], "error: --file {tmp}/texts.txt: no such file"),
    "texts file is a folder": (["infer", "--file", "{tmp}"], "error: --file {tmp}: a folder; --file takes a text "
                                                             "file, one text per line"),
    "texts file empty": (["infer", "--file", "{file}"], "error: --file {file}: no lines; write one text per line"),
    "texts file not utf-8": (["infer", "--file", "{file}"], "error: --file {file}: not UTF-8 text (invalid "
                                                            "continuation byte at byte 3); save it as UTF-8"),
    "weights without torchvision": (["build", "resnet_pt", "--target", "portable", "--weights", "{file}"],
                                    "error: --weights {file}: a state dict needs torchvision, which does not import "
                                    "here"),
    "weights folder without weights": (["build", "resnet_pt", "--target", "portable", "--weights", "{tmp}"],
                                       "error: --weights {tmp}: no weights file (model.safetensors, "
                                       "pytorch_model.bin)"),
    "model folder not sentence-transformers": (["build", "bert", "--target", "portable", "--model", "{tmp}"],
                                               "modules.json: missing, which a sentence-transformers folder has"),
    "nothing listening": (["infer", "hello", "--url", "127.0.0.1:{port}"],
                          "error: nothing answers at 127.0.0.1:{port} (Connection refused)"),
    "https": (["infer", "hello", "--url", "https://127.0.0.1:{port}"],
              "error: --url https://127.0.0.1:{port}: Triton's HTTP endpoint as host:port"),
    # tritonclient's ValueError, and "Exception ignored in InferenceServerClient.__del__" after it
    "url port out of range": (["infer", "hello", "--url", "127.0.0.1:99999"],
                              "error: --url 127.0.0.1:99999: Triton's HTTP endpoint as host:port (or http://host:port) "
                              "with a port of 1-65535, e.g. 127.0.0.1:8000"),
    "url port not a number": (["infer", "hello", "--url", "127.0.0.1:abc"],
                              "error: --url 127.0.0.1:abc: Triton's HTTP endpoint as host:port"),
    "tarball missing": (["upload", "{tmp}/bert.tar.gz", "s3://bucket/models/"],
                        "error: {tmp}/bert.tar.gz: no such file"),
    "envs folder not creatable": (["env", "text", "--out", "/proc/tritonpack-envs"],
                                  "error: /proc/tritonpack-envs: No such file or directory"),
    "tarball not built": (["check", "{tmp}/bert_pt-portable.tar.gz"], "error: {tmp}/bert_pt-portable.tar.gz: no "
                          "such file or folder; `make build NAME=bert_pt TARGET=portable` builds it"),
    "cache not creatable": (["mme", "--models", "{tmp}", "--cache-dir", "/proc/tritonpack-cache"],
                            "error: --cache-dir /proc/tritonpack-cache: cannot create it (No such file or directory)"),
    "container malformed": (["build", "bert", "--target", "portable", "--container", "24"],
                            "error: '24' is not a Triton container release: write YY.MM, e.g. 24.09"),
    "env python malformed": (["build", "bert", "--target", "portable", "--env-python", "3"],
                             "error: --env-python '3': write the Python minor version, e.g. 3.10"),
    # the environment was packed for 3.10 and the manifest said 23.03-24.11, without a word
    "container and env python disagree": (["build", "bert", "--target", "portable", "--container", "25.01",
                                           "--env-python", "3.10"],
                                          "error: --container 25.01 runs Python 3.12 and --env-python 3.10 asks for "
                                          "another: give one of them"),
    "envs for two Pythons": (["env", "text", "--container", "25.01", "--python", "3.10", "--out", "{tmp}/envs"],
                             "error: --container 25.01 runs Python 3.12 and --python 3.10 asks for another"),
    # `check` took 24.9 for 24.09, where `deploy --triton-version` refused it
    "container month of one digit": (["check", "{tmp}", "--container", "24.9"],
                                     "error: '24.9' is not a Triton container release: write YY.MM, e.g. 24.09"),
    "envs folder is a file": (["env", "text", "--out", "{file}"],
                              "error: --out {file}: a file; --out takes a folder (made where it is not there)"),
    "dist folder is a file": (["build", "bert", "--target", "portable", "--dist", "{file}"],
                              "error: --dist {file}: a file; --dist takes a folder (made where it is not there)"),
    "check the dist folder": (["check", "{tmp}"], "holds 1 built repositories and tarballs, not one repository; "
                                                 "check one: `tritonpack check {tmp}/bert-portable.tar.gz`"),
    "serve a tarball": (["serve", "{file}"], "error: {file} is a file: `serve` takes a repository folder"),
    "serve a folder of no models": (["serve", "{tmp}"], "would not load: {tmp_name}: models: no model folder"),
    "serve two services on one port": (["serve", "{tmp}", "--http-port", "18000", "--grpc-port", "18000"],
                                       "error: --http-port and --grpc-port both ask for port 18000: give each its "
                                       "own, or 0 for a free one"),
    "mme models is a file": (["mme", "--models", "{file}"], "error: --models {file}: a file; --models takes the "
                                                            "folder holding the tarballs"),
    "plan compute capability": (["build", "resnet_trt", "--target", "gpu", "--plan", "86={file}"],
                                "error: --plan 86={file}: write the compute capability as MAJOR.MINOR, e.g. --plan "
                                "8.6={file}"),
    "gpu without tensorrt": (["build", "resnet_trt", "--target", "gpu"],  # before the ONNX export it would build
                             "error: TensorRT is not installed"),
    "deploy version": (["deploy", "--name", "e", "--model-data-url", "s3://b/p/", "--role", "r", "--dry-run",
                        "--triton-version", "foo"], "error: --triton-version 'foo': a container release such as"),
    "deploy no instance": (["deploy", "--name", "e", "--model-data-url", "s3://b/p/", "--role", "r", "--dry-run",
                            "--min-instances", "0"], "error: --min-instances must be at least 1"),
    "deploy name": (["deploy", "--name", "bad name!", "--model-data-url", "s3://b/p/", "--role", "r", "--dry-run"],
                    "error: --name 'bad name!': letters, digits and hyphens"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_cli_prints_one_line_and_exits_2_for_each_user_mistake(mistake, tmp_path, capsys):
    argv, said = MISTAKES[mistake]
    fill = {"tmp": tmp_path, "tmp_name": tmp_path.name, "port": closed_port(), "file": tmp_path / "a-file"}
    argv = [a.format(**fill) for a in argv]
    if mistake == "check the dist folder":
        (tmp_path / "bert-portable.tar.gz").write_bytes(b"")
    elif mistake == "texts file not utf-8":
        fill["file"].write_bytes("café\n".encode("latin-1"))
    elif mistake != "serve a folder of no models":
        fill["file"].write_text("")
    if argv[0] == "build" and "--dist" not in argv:
        argv += ["--dist", str(tmp_path / "dist")]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and said.format(**fill) in err[0], err


@pytest.mark.parametrize(("argv", "said"), [
    (["serve", "dist/bert-portable", "--http-port", "99999"], "is not a port (0-65535; 0: a free one)"),
    (["mme", "--models", "dist", "--port", "-1"], "is not a port (0-65535; 0: a free one)"),
    (["check", "dist/bert-portable", "--max-members", "0"], "argument --max-members: '0' is not a positive number "
                                                            "of archive entries"),
    (["mme", "--models", "dist", "--max-payload-bytes", "0"], "argument --max-payload-bytes: '0' is not a positive "
                                                              "number of bytes"),
    (["mme", "--models", "dist", "--max-models", "x"], "argument --max-models: 'x' is not a positive number of models"),
    (["mme", "--models", "dist", "--drain-seconds", "-1"], "argument --drain-seconds: '-1' is not a number of seconds "
                                                           "(0 or more)"),
    (["mme", "--models", "dist", "--drain-seconds", "nan"], "'nan' is not a number of seconds (0 or more)"),
    # botocore's ValueError("Invalid endpoint") ended in a traceback
    (["infer", "hi", "--mme", "127.0.0.1:8080", "--target-model", "a.tar.gz"], "write the endpoint as http://"),
    (["upload", "a.tar.gz", "s3://b/p/", "--endpoint-url", "notaurl"], "write the endpoint as http://"),
    (["check", "dist/bert-portable", "--python", "2"], "write the Python minor version as X.Y"),
    (["mme", "--models", "dist", "--container-python", "310"], "write the Python minor version as X.Y"),
    # it was taken, and pip spent minutes building numpy from source for it
    (["mme", "--models", "dist", "--container-python", "3.13"], "argument --container-python: no Triton container "
     "runs Python 3.13: theirs are 3.6 (20.03-20.11), 3.8 (20.12-23.02), 3.10 (23.03-24.11), 3.12 (24.12+)"),
])
def test_cli_refuses_a_malformed_option_value_in_one_line(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.splitlines()  # argparse printed its whole usage block first
    assert line.startswith(f"error: tritonpack {argv[0]}: ") and said in line
    assert line.endswith(f"`tritonpack {argv[0]} --help` lists the options")


@pytest.mark.parametrize(("argv", "said"), [
    (["build", "bertt"], "error: tritonpack build: argument name: invalid choice: 'bertt' (choose from 'bert', "
                         "'bert_pt', 'dali_inception', 'resnet_pt', 'resnet_trt'); did you mean 'bert'? "
                         "`tritonpack build --help` lists the options"),
    (["biuld", "bert"], "error: tritonpack: argument command: invalid choice: 'biuld' (choose from 'build', 'serve', "
                        "'infer', 'bench', 'mme', 'check', 'env', 'upload', 'deploy'); did you mean 'build'? "
                        "`tritonpack --help` lists the options"),
    (["serve"], "error: tritonpack serve: the following arguments are required: repository; `tritonpack serve "
                "--help` lists the options"),
])
def test_cli_says_a_mistyped_name_or_a_missing_argument_in_one_line_with_the_closest_choice(argv, said):
    result = run_cli(*argv)
    assert (result.returncode, result.stderr.splitlines()) == (2, [said])


def test_build_scripts_say_the_users_mistakes_in_one_line():
    # `make ensemble` is the usual way in; README also shows the standalone scripts (`python -m tritonpack.build.…`)
    missing = subprocess.run([sys.executable, "-m", "tritonpack.build.export_text_encoder", "/nonexistent", "out"],
                             capture_output=True, text=True, timeout=120)
    assert (missing.returncode, missing.stderr.splitlines()) == (
        2, ["error: /nonexistent/modules.json: missing, which a sentence-transformers folder has"])
    usage = subprocess.run([sys.executable, "-m", "tritonpack.build.export_text_encoder"], capture_output=True,
                           text=True, timeout=120)
    assert usage.returncode == 2
    assert usage.stderr.splitlines() == [
        "error: python -m tritonpack.build.export_text_encoder: the following arguments are required: model_dir, "
        "out_dir; `python -m tritonpack.build.export_text_encoder --help` lists the options"]


def test_cli_bench_passes_what_follows_the_double_dash_to_the_benchmarks(capfd):
    assert main(["bench", "--", "--help"]) == 0
    assert capfd.readouterr().out.startswith("usage: python -m benchmarks")


def test_cli_bench_passes_its_options_to_the_benchmarks_without_a_double_dash():
    """`tritonpack bench --mode smoke`, as its help says; a mistake in them is the benchmarks' one line."""
    result = run_cli("bench", "--concurrency", "8,x", "--mode", "smoke")
    assert (result.returncode, result.stderr.splitlines()) == (2, [
        "error: python -m benchmarks: argument --concurrency: 'x' is not a positive number of clients; "
        "`python -m benchmarks --help` lists the options"])
    assert run_cli("bench", "--mode", "smok").stderr.splitlines() == [
        "error: python -m benchmarks: argument --mode: invalid choice: 'smok' (choose from 'full', 'smoke'); "
        "did you mean 'smoke'? `python -m benchmarks --help` lists the options"]
    assert run_cli("serve", "dist/bert-portable", "--mode", "smoke").stderr.splitlines() == [
        "error: tritonpack: unrecognized arguments: --mode smoke; `tritonpack --help` lists the options"]


def test_cli_keeps_the_traceback_when_the_failure_is_a_bug(monkeypatch):
    import argparse

    def broken(_args):
        raise KeyError("a bug, not the user's mistake")

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args",
                        lambda self, argv=None: (argparse.Namespace(func=broken), []))
    with pytest.raises(KeyError, match="a bug"):
        main(["build", "bert"])


def test_cli_build_smoke_names_the_serving_command_when_the_local_triton_lacks_the_backends(tmp_path, test_dist):
    """The newcomer path: `make ensemble TARGET=cpu` builds, checks, and says in one line where the repository runs."""
    dist = tmp_path / "my dist"  # the commands it prints quote what the shell would split
    dist.mkdir()
    (dist / "cache").symlink_to(test_dist / "cache")
    result = run_cli("build", "bert", "--target", "cpu", "--smoke", "--dist", str(dist))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "check:      ok (4 models, entry bert)" in result.stdout
    repository, served = dist / "bert-cpu", (dist / "bert-cpu.triton").resolve()
    tarball, served = shlex.quote(str(served.with_suffix(".tar.gz"))), shlex.quote(str(served))
    assert result.stdout.splitlines()[-1] == (
        f"{repository} needs Triton's onnxruntime_onnx backend, which the local Triton (python backend only) lacks; "
        f"serve it with: rm -rf {served} && mkdir {served} && tar -xzf {tarball} -C {served} && docker run "
        f"--rm -p8000:8000 -v {served}:/models nvcr.io/nvidia/tritonserver:24.09-py3 tritonserver "
        f"--model-repository=/models")  # the tarball: its environment has what the container's Python lacks
    assert (dist / ".bert.target").read_text() == "cpu\n"


def test_cli_serve_says_to_build_the_tarball_again_when_a_native_repositorys_tarball_is_gone(
        tmp_path, build_ensemble, capsys):
    """Without the tarball beside it, the printed `tar -xzf …/bert-cpu.tar.gz` failed; a repository tritonpack did not
    build (no manifest) is served as it is."""
    repository = Path(shutil.copytree(build_ensemble("bert", "cpu").repository, tmp_path / "my dist" / "bert-cpu"))
    assert main(["serve", str(repository)]) == 0
    served = shlex.quote(str(repository.resolve().with_name("bert-cpu.triton")))
    docker = "docker run --rm -p8000:8000 -v {}:/models nvcr.io/nvidia/tritonserver:24.09-py3 tritonserver " \
             "--model-repository=/models"
    lacks = f"{repository} needs Triton's onnxruntime_onnx backend, which the local Triton (python backend only) lacks"
    assert capsys.readouterr().out.splitlines() == [
        f"{lacks}; its tarball {repository}.tar.gz is gone: build it again as before (`make build NAME=bert "
        f"TARGET=cpu` builds it), then serve it with: rm -rf {served} && mkdir {served} && tar -xzf "
        f"{shlex.quote(str(repository.resolve()) + '.tar.gz')} -C {served} && {docker.format(served)}"]
    (repository / "manifest.json").unlink()
    assert main(["serve", str(repository)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{lacks}; serve it with: {docker.format(shlex.quote(str(repository.resolve())))}"]


def test_docker_command_extracts_into_a_fresh_folder_when_an_earlier_build_was_extracted_there(tmp_path):
    """`mkdir -p` then `tar -x` over an earlier extraction kept the earlier build's steps (other digest names),
    which Triton then loaded beside the new ones."""
    import tarfile

    from tritonpack.containers import docker_command

    repository = tmp_path / "bert-cpu"
    for step in ("bert_tokenizer_old", "bert_tokenizer_new"):
        (tmp_path / step).mkdir()
        (tmp_path / step / "config.pbtxt").write_text(f'name: "{step}"\n')
        with tarfile.open(f"{repository}.tar.gz", "w:gz") as tar:
            tar.add(tmp_path / step, arcname=step)
        extract = docker_command(repository, "cpu").split(" && docker run ")[0]
        subprocess.run(["bash", "-c", extract], check=True)
    assert [p.name for p in (tmp_path / "bert-cpu.triton").iterdir()] == ["bert_tokenizer_new"]


def stamp_prerequisites(folder: Path) -> None:
    """The files the Makefile's .venv stamp depends on, dated 1970: older than any stamp, so a .venv that has one is
    not installed again (`-n` only prints the install anyway)."""
    for prerequisite in ("requirements.txt", "pyproject.toml"):
        (folder / prerequisite).touch()
        os.utime(folder / prerequisite, (0, 0))


@pytest.mark.parametrize(("recorded", "given", "expected"), [("gpu", "", "zzz-gpu"), ("gpu", "cpu", "zzz-cpu"),
                                                             (None, "", "zzz-portable")])
def test_makefile_serves_the_repository_the_last_build_chose_when_no_target_is_given(tmp_path, recorded, given,
                                                                                     expected):
    stamp_prerequisites(tmp_path)
    if recorded:
        (tmp_path / "dist").mkdir()
        (tmp_path / "dist" / ".zzz.target").write_text(recorded + "\n")
    result = subprocess.run(["make", "-n", "-f", str(MAKEFILE), "serve", "check", "NAME=zzz", f"TARGET={given}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"tritonpack serve dist/{expected}\n" in result.stdout
    assert f"tritonpack check dist/{expected}.tar.gz" in result.stdout


@pytest.mark.parametrize(("recorded", "said"), [
    ("portable", "invoke: .venv/bin/tritonpack infer --mme http://127.0.0.1:8080 --target-model bert-portable.tar.gz "
                 "'some text'"),
    # it printed that invoke line, which the local MME then refused
    ("cpu", "note: bert-cpu.tar.gz is a cpu build: the local MME cannot load it (its Triton has only the python "
            "backend); make build NAME=bert TARGET=portable builds one it serves")])
def test_make_mme_names_how_to_invoke_the_tarball_or_why_the_local_mme_cannot_load_it(tmp_path, recorded, said):
    stamp_prerequisites(tmp_path)
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / ".bert.target").write_text(recorded + "\n")
    result = subprocess.run(["make", "-n", "-f", str(MAKEFILE), "mme"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert f'echo "{said}"' in result.stdout.splitlines()


@pytest.mark.parametrize(("variable", "said"), [
    ("MME_PORT=abc", "error: tritonpack mme: argument --port: 'abc' is not a port (0-65535; 0: a free one)"),
    ("MAX_MODELS=0", "error: tritonpack mme: argument --max-models: '0' is not a positive number of models"),
    ("CONTAINER_PYTHON=3.13", "error: tritonpack mme: argument --container-python: no Triton container runs Python "
                              "3.13")])
def test_make_mme_refuses_a_malformed_option_before_it_builds_the_missing_tarball(tmp_path, variable, said):
    """It built the tarball (minutes) and only then said that the port was no number."""
    (tmp_path / ".venv").symlink_to(sys.prefix)  # this .venv, installed
    stamp_prerequisites(tmp_path)
    result = subprocess.run(["make", "-f", str(MAKEFILE), "mme", variable], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0].startswith(said), result.stderr
    assert "build" not in result.stdout and not (tmp_path / "dist").exists()


@pytest.mark.parametrize("interpreter", ["missing", "another version"])
def test_make_says_in_one_line_which_python_venv_needs_and_creates_nothing(tmp_path, interpreter):
    """A fresh machine without Python 3.11 (Ubuntu 24.04 has 3.12): `make ensemble` names the version, why, and the
    command that fixes it, instead of `python3.11: command not found`, and leaves no half-made .venv behind."""
    stamp_prerequisites(tmp_path)
    python = tmp_path / "python3.9"
    if interpreter == "another version":  # answers the version probe as any Python but 3.11 does
        python.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.exit(1)'\n")
        python.chmod(0o755)
    result = subprocess.run(["make", "-f", str(MAKEFILE), "ensemble", f"PYTHON={python}"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    said = result.stderr.splitlines()[0]
    assert said == (f"error: .venv needs Python 3.11 (the bundled tritonserver's python stub runs its version), and "
                    f"{python} is missing or another version: install it (apt install python3.11-venv, or pyenv "
                    f"install 3.11) or name one: make ensemble PYTHON=/path/to/python3.11"), result.stderr
    assert not (tmp_path / ".venv").exists()


def test_cli_build_says_in_one_line_when_the_disk_is_full_and_leaves_nothing_partial(tmp_path, test_dist):
    """A full disk is a limit of the user's machine: one line naming where and the fix, exit 2, no traceback, and
    no half-written repository left to fill the disk further."""
    with small_disk(tmp_path / "dist", 8 << 20):  # the repository alone is ~45 MB
        (tmp_path / "dist" / "cache").symlink_to(test_dist / "cache")
        result = run_cli("build", "bert", "--no-env", "--dist", str(tmp_path / "dist"))
        left = sorted(p.name for p in (tmp_path / "dist").iterdir())
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    said = result.stderr.strip().splitlines()[-1]  # after the build's own line saying which target
    assert said.startswith(f"error: no space left on the device of {tmp_path / 'dist'} ") and "make clean" in said
    assert left == ["cache"]


@contextlib.contextmanager
def read_only(path: Path):
    """`path` as a read-only bind mount of itself: writes under it fail with EROFS, for root too (chmod does not
    stop root; mounting needs root, which CI has)."""
    for options in (["--bind"], ["-o", "remount,bind,ro"]):
        done = subprocess.run(["mount", *options, str(path), str(path)], capture_output=True, text=True)
        if done.returncode:
            unmount(path)
            pytest.fail(f"this test mounts a folder read-only and needs root: {done.stderr.strip()}")
    try:
        yield path
    finally:
        unmount(path)


def unmount(path: Path) -> None:
    subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=False)


def refuse_mkdir_under(monkeypatch, folder: Path) -> None:
    """What a user who may not write `folder` gets (root may): os.mkdir under it raises EACCES."""
    import errno

    mkdir = os.mkdir

    def refused(path, *args, **kwargs):
        if Path(path).absolute().is_relative_to(folder):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refused)


@pytest.mark.parametrize(("refusal", "reason"), [("read-only mount", "read-only file system"),
                                                 ("read-only mount, cache elsewhere", "read-only file system"),
                                                 ("no permission", "permission denied")])
def test_cli_build_says_in_one_line_that_it_cannot_write_the_dist_folder_and_keeps_what_was_there(
        refusal, reason, tmp_path, monkeypatch, capsys):
    """A read-only dist/ ended in a traceback (EROFS) or a bare staging path (EACCES); with dist/cache linked to a
    writable folder, only after the artifacts were made."""
    dist = tmp_path / "dist"
    (dist / "bert-portable" / "bert").mkdir(parents=True)
    (dist / "bert-portable" / "bert" / "config.pbtxt").write_text('name: "bert"\n')
    argv = ["build", "bert", "--target", "portable", "--dist", str(dist)]
    cache = tmp_path / "cache"
    if refusal == "read-only mount, cache elsewhere":
        cache.mkdir()
        (dist / "cache").symlink_to(cache)
    if refusal.startswith("read-only mount"):
        with read_only(dist):
            assert main(argv) == 2
    else:
        refuse_mkdir_under(monkeypatch, dist)
        assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: cannot write {dist}: {reason}; make it writable, or write elsewhere with --dist FOLDER"]
    assert [str(p.relative_to(dist)) for p in sorted(dist.rglob("*")) if p.name != "cache"] == [
        "bert-portable", "bert-portable/bert", "bert-portable/bert/config.pbtxt"]
    assert not cache.exists() or list(cache.iterdir()) == []  # failed before making anything


def test_replace_folder_leaves_the_new_folder_whole_when_the_old_one_cannot_all_be_removed(tmp_path):
    """rmtree of the old repository stopped at a part it could not remove (a read-only mount here; another user's
    files for a user): the old repository was left half-deleted and the new one not moved in."""
    from tritonpack.errors import UserError
    from tritonpack.repository import replace_folder

    old, new = tmp_path / "bert-portable", tmp_path / ".staging"
    for folder, models in ((old, ("a", "b", "locked", "z")), (new, ("bert", "bert_encoder"))):
        for model in models:
            (folder / model).mkdir(parents=True)
            (folder / model / "config.pbtxt").write_text(f'name: "{model}"\n')
    with read_only(old / "locked"):
        try:
            with pytest.raises(UserError) as refused:
                replace_folder(new, old)
        finally:
            for aside in tmp_path.glob(".bert-portable-replaced-*"):
                unmount(aside / "locked")  # the mount moved with the folder set aside
    assert sorted(p.name for p in old.iterdir()) == ["bert", "bert_encoder"] and not new.exists()
    (aside,) = tmp_path.glob(".bert-portable-replaced-*")
    assert str(refused.value) == (f"{old} is replaced, but its previous contents, moved to {aside}, could not all be "
                                  f"removed (read-only file system): remove that folder as a user who may, then run "
                                  f"the command again")


def test_replace_folder_puts_the_old_folder_back_when_the_new_one_cannot_be_moved_in(tmp_path, monkeypatch):
    from tritonpack.repository import replace_folder

    old, new = tmp_path / "bert-portable", tmp_path / ".staging"
    for folder in (old, new):
        (folder / "bert").mkdir(parents=True)
    rename = Path.rename

    def refused(self, target):
        if self == new:
            raise PermissionError(13, "Permission denied", str(self))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refused)
    with pytest.raises(PermissionError):
        replace_folder(new, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".staging", "bert-portable"] and (old / "bert").is_dir()


CHOSEN = "TARGET=portable (a CUDA GPU and TensorRT not found; set TARGET=cpu|gpu to choose)"


@pytest.mark.parametrize(("argv", "said"), [
    (["--io-names", "bad"], "error: --io-names 'bad': expected INPUT:OUTPUT, e.g. INPUT0:OUTPUT0"),
    (["--serving", "no_such_setting=1"], "error: unknown serving setting 'no_such_setting'; one of "),
])
def test_cli_build_says_only_the_error_when_it_is_not_about_the_target_it_chose(argv, said, tmp_path, monkeypatch,
                                                                                capsys):
    """`make build NAME=bert IO_NAMES=bad` printed "set TARGET=cpu|gpu to choose" above an error about --io-names."""
    from tritonpack import builder

    monkeypatch.setattr(builder, "default_target", lambda: ("portable", CHOSEN))
    assert main(["build", "bert", *argv, "--dist", str(tmp_path / "dist")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(said)


def test_cli_build_says_why_it_chose_the_target_when_the_error_is_about_that_target(tmp_path, monkeypatch, capsys):
    from tritonpack import builder
    from tritonpack.errors import ToolUnavailable

    def unavailable(*_):
        raise ToolUnavailable("DALI is not installed")

    monkeypatch.setattr(builder, "default_target", lambda: ("portable", CHOSEN))
    monkeypatch.setattr(builder, "assemble", unavailable)
    assert main(["build", "bert", "--dist", str(tmp_path / "dist")]) == 2
    assert capsys.readouterr().err.splitlines() == [CHOSEN, "error: DALI is not installed; build bert for gpu or cpu "
                                                            "instead (make ensemble NAME=bert TARGET=cpu)"]


@pytest.mark.parametrize(("name", "target", "serving", "cuda", "hinted"), [
    ("bert_pt", "portable", (), True, True),
    ("bert_pt", "portable", (("dynamic_batching", "false"),), True, True),
    ("bert_pt", "portable", (("encoder_instances", "3"),), True, False),  # the user chose the instances
    ("bert_pt", "portable", (), False, False),  # no GPU here: the CPU defaults are the right ones
    ("bert_pt", "cpu", (), True, False),
    ("bert", "portable", (), True, False),  # OpenVINO's encoder runs on the CPU
    ("resnet_pt", "portable", (), True, False),
])
def test_a_portable_build_on_a_gpu_machine_names_the_instances_that_serve_it_faster_there(name, target, serving, cuda,
                                                                                        hinted, monkeypatch):
    """A portable TorchScript encoder computes on CUDA where the server has a GPU, where two of each step served
    1.43x at c=64 (docs/performance.md, forty-seventh round); on a CPU the same settings lose five-fold."""
    from tritonpack import builder, ensembles

    monkeypatch.setattr(builder, "cuda_available", lambda: cuda)
    hint = builder.portable_on_gpu_hint(builder.BuildRequest(name, target, serving=serving))
    if hinted:
        assert hint == (f"note: to serve {name} portable on this machine's GPU, build it with --serving "
                        f"tokenizer_instances=2 --serving encoder_instances=2 (1.43x the defaults at 64 concurrent "
                        f"requests on an H200; README, \"Batching and instances\")")
        settings = TextServing().with_overrides(ensembles.recipe(name).portable_on_gpu)
        assert (settings.tokenizer_instances, settings.encoder_instances) == (2, 2)
    else:
        assert hint is None


def test_write_tarball_leaves_no_partial_file_when_the_disk_fills(tmp_path, build_ensemble):
    from tritonpack.repository import write_tarball

    with small_disk(tmp_path / "disk", 4 << 20), pytest.raises(OSError, match="No space left"):
        try:
            write_tarball(build_ensemble("bert").repository, tmp_path / "disk" / "bert.tar.gz")
        finally:
            assert list((tmp_path / "disk").iterdir()) == []


def test_cli_build_says_in_one_line_that_resnet_weights_are_a_git_lfs_pointer(tmp_path, capsys):
    """A transformers ResNet folder cloned without git-lfs ended in safetensors' "header too large" traceback."""
    weights = tmp_path / "resnet"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    (weights / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    assert main(["build", "resnet_pt", "--target", "portable", "--weights", str(weights), "--dist",
                 str(tmp_path / "dist")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"error: --weights {weights}/model.safetensors: a git-lfs "
                                                        f"pointer, not the weights: run `git lfs pull` in {weights}")


def test_cli_infer_says_the_server_did_not_answer_in_time_when_tritonclient_times_out(monkeypatch, capsys):
    """A listener that never answers makes tritonclient raise TimeoutError after 60 s (stood in for here, to not
    wait a minute): it was taken for "nothing answers … start a server first"."""
    from tritonpack import client

    def silent(*args, **kwargs):
        raise TimeoutError("timed out")

    monkeypatch.setattr(client, "text_contract", silent)  # the first call to the server
    assert main(["infer", "hello", "--url", "127.0.0.1:9"]) == 1
    assert capsys.readouterr().err.strip() == ("error: 127.0.0.1:9 did not answer within 60 s (tritonclient's "
                                               "timeout): a server still loading, or not Triton's HTTP port")


@pytest.mark.server
def test_cli_serve_answers_from_a_copy_when_the_repository_path_holds_a_space(tmp_path):
    """The python backend starts each stub through a shell with the model's path unquoted: `make ensemble` in a
    checkout whose path held a space built, then refused to serve."""
    from tests.mme_support import python_model_repository

    repository = python_model_repository(tmp_path / "my models", "m")
    result = run_cli("serve", str(repository), "--smoke")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    said = result.stdout.splitlines()
    assert said[0].startswith("serving a copy in ") and said[0].endswith(
        f": Triton's python backend cannot start a stub from {repository} (a space or a shell character in its path)")
    copy = Path(said[0].removeprefix("serving a copy in ").partition(": ")[0])
    assert " " not in str(copy) and not copy.exists()  # removed once served
    assert f"m: {DEMO_TEXTS[0]!r} → EMBEDDING (4,)" in result.stdout


def test_cli_serve_refuses_in_one_line_when_the_temporary_folder_holds_a_space_too(tmp_path, monkeypatch, capsys):
    import tempfile

    from tests.mme_support import python_model_repository

    repository = python_model_repository(tmp_path / "my models", "m")
    (tmp_path / "my tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "my tmp"))
    assert main(["serve", str(repository)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {repository}: its path holds ' ', which Triton's python backend passes unquoted")
    assert line.endswith("holds them too: set TMPDIR to a folder without them") and f"{tmp_path}/my tmp/" in line
    assert list((tmp_path / "my tmp").iterdir()) == []


def test_cli_serve_refuses_in_one_line_when_this_python_has_numpy_2(tmp_path, monkeypatch, capsys):
    """The local Triton's stub (2.51) binds numpy with pybind11 2.10 and reads numpy 2's arrays with a stride of 0:
    served from a Python with numpy 2.5.2 (the lent GPU machine's), the tokenizer's stub aborted at its first request
    reading the first byte of the text four times as its length."""
    import tritonpack.server
    from tests.mme_support import python_model_repository

    repository = python_model_repository(tmp_path / "models", "m")
    monkeypatch.setattr(tritonpack.server, "local_numpy_version", lambda: "2.5.2")
    assert main(["serve", str(repository)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {repository} would not load: m_step/config.pbtxt: parameters.EXECUTION_ENV_PATH: "
                           f"not set, so the local Triton runs the model in this Python, whose numpy 2.5.2")
    assert "install numpy<2 into this Python (`pip install 'numpy<2'`)" in line


def test_docker_command_names_the_container_the_repository_was_built_for(tmp_path):
    from tritonpack.containers import DEFAULT_CONTAINER, built_for, docker_command

    (tmp_path / "manifest.json").write_text(json.dumps({"build": {"container": "25.03"}}))
    assert built_for(tmp_path) == "25.03" and "tritonserver:25.03-py3" in docker_command(tmp_path, "cpu", "25.03")
    (tmp_path / "manifest.json").write_text("{not json")
    assert built_for(tmp_path) == DEFAULT_CONTAINER


def test_cli_env_names_a_misspelt_environment_before_creating_its_output_folder(tmp_path, capsys):
    assert main(["env", "txet", "--out", str(tmp_path / "envs")]) == 2
    assert "error: no environment 'txet'" in capsys.readouterr().err and not (tmp_path / "envs").exists()


def test_cli_infer_ends_at_once_with_one_line_when_interrupted_while_the_server_does_not_answer():
    """Ctrl-C while tritonclient waited for an answer: gevent's hub printed it, then Python's traceback followed."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(60)
        argv = ["infer", "hello", "--url", f"127.0.0.1:{silent.getsockname()[1]}"]
        # as from a terminal: a shell's background job (CI's, possibly) starts with SIGINT ignored, and so would this
        with subprocess.Popen([sys.executable, "-m", "tritonpack.cli", *argv], stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as command:
            connection, _ = silent.accept()
            with connection:
                assert connection.recv(65536).startswith(b"GET /v2/models/bert ")  # now waiting for its metadata
                interrupted = time.monotonic()
                command.send_signal(signal.SIGINT)
                said = command.communicate(timeout=30)[1]
    assert (command.returncode, said) == (130, "interrupted\n") and time.monotonic() - interrupted < 10


@pytest.mark.parametrize("answer", [b"\x00\x00\x12\x04\x00\x00\x00\x00\x00not http\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nnot json"],
                         ids=["not http", "not json"])
def test_cli_infer_says_in_one_line_when_the_url_does_not_answer_as_triton(answer, capsys):
    """What answered there (the gRPC port, another HTTP service) ended in geventhttpclient's or rapidjson's
    traceback."""
    import socket
    import threading

    def answer_once(listener: socket.socket) -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(answer)

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(60)
        answering = threading.Thread(target=answer_once, args=(listener,))
        answering.start()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        try:
            assert main(["infer", "hello", "--url", address]) == 2
        finally:
            answering.join()
    assert capsys.readouterr().err.splitlines() == [
        f"error: {address} did not answer as Triton's HTTP endpoint (is it the gRPC port, 8001?): pass the HTTP "
        f"port as --url, e.g. 127.0.0.1:8000"]


def test_cli_says_interrupted_and_exits_130_when_ctrl_c_comes_before_serve_starts_tritonserver(tmp_path,
                                                                                              monkeypatch, capsys):
    """Ctrl-C while serve checked the repository (hashing its files) ended in a traceback."""
    from tests.mme_support import python_model_repository
    from tritonpack import check

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(check, "check", interrupted)
    try:
        assert main(["serve", str(python_model_repository(tmp_path / "repo", "m"))]) == 130
    except KeyboardInterrupt:  # let through, it would end the test session
        pytest.fail("the interrupt went through main() as a traceback")
    assert capsys.readouterr().err == "interrupted\n"


def test_stop_signals_after_the_first_are_ignored_while_the_command_stops():
    """A second Ctrl-C while start() stopped an interrupted tritonserver left its stubs and regions behind. The
    handler is called as the signal would call it (a real SIGINT here would also reach the rest of the suite)."""
    from tritonpack.cli import STOP_SIGNALS, stopped_by_signals

    before = signal.getsignal(signal.SIGINT)
    with stopped_by_signals():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
        assert {signal.getsignal(signum) for signum in STOP_SIGNALS} == {signal.SIG_IGN}
    assert signal.getsignal(signal.SIGINT) is before
