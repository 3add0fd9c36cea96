"""The `tritonpack` command line: every documented subcommand has --help; infer reads arguments and files."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tritonpack.cli import main

SUBCOMMANDS = ["build", "serve", "check", "infer", "mme", "upload", "deploy"]


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
    assert main(["infer", "plain output", "--url", server.url]) == 0
    assert "bert: 1 embeddings of 384 floats" in capsys.readouterr().out
