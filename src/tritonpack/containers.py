"""Triton container releases: which Python their python backend stub runs, and how to serve a repository in one.

The SageMaker Triton images follow the NGC releases of the same number (`sagemaker-tritonserver:<YY.MM>-py3`).
"""

from __future__ import annotations

from pathlib import Path

from tritonpack.errors import EnvError

# The SageMaker Triton container the environments and the serving hints are made for unless asked otherwise
# (the newest in the SageMaker Python SDK's image list, sagemaker-tritonserver 24.09: Triton 2.50, Python 3.10).
DEFAULT_CONTAINER = "24.09"

# Triton container release (YY.MM, inclusive ranges) → the Python its python backend stub runs. From Triton's
# release notes ("Contents of the Triton Inference Server container": Ubuntu 18.04 + 3.6, 20.04 + 3.8,
# 22.04 + 3.10, 24.04 + 3.12) and aws/sagemaker-inference-toolkit#134 (py38 up to 23.02, py310 after).
CONTAINER_PYTHON: tuple[tuple[str, str, str], ...] = (
    ("20.03", "20.11", "3.6"),
    ("20.12", "23.02", "3.8"),
    ("23.03", "24.11", "3.10"),
    ("24.12", "99.99", "3.12"),
)


def version_key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def container_python(container: str) -> str:
    """The Python minor version of a Triton container release such as `24.10`."""
    key = version_key(container)
    for first, last, python in CONTAINER_PYTHON:
        if version_key(first) <= key <= version_key(last):
            return python
    raise EnvError(f"unknown Triton container {container!r}; known from {CONTAINER_PYTHON[0][0]}")


def containers_for(python: str) -> list[str]:
    """Container release ranges whose Python is `python`, e.g. ['23.03-24.11']."""
    return [f"{first}-{last}" if last != "99.99" else f"{first}+" for first, last, py in CONTAINER_PYTHON
            if py == python]


def docker_command(repository: Path, target: str, container: str = DEFAULT_CONTAINER) -> str:
    """The command that serves `repository` in the NGC Triton container of that release (GPUs for `gpu`)."""
    gpus = "--gpus all " if target == "gpu" else ""
    return (f"docker run --rm {gpus}-p8000:8000 -v {Path(repository).resolve()}:/models "
            f"nvcr.io/nvidia/tritonserver:{container}-py3 tritonserver --model-repository=/models")
