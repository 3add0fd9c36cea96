"""Build a TensorRT engine (`model.plan`) from an ONNX file with the TensorRT Python API.

    python -m tritonpack.build.build_tensorrt MODEL.onnx OUT.plan --profile NAME=MIN,OPT,MAX [...] [--fp16]

A profile gives each dynamic input its min/opt/max shape, e.g. input_ids=1x1,16x128,64x256.
Needs a CUDA GPU and the `tensorrt` package; without them it stops with one line saying which is missing.
This file was not executed in the project's environment (no TensorRT there): see README.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from tritonpack.cache import producer
from tritonpack.errors import ToolUnavailable


class TensorRTUnavailable(ToolUnavailable):
    pass


@dataclass(frozen=True)
class ShapeProfile:
    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(f"profile {self.name}: min/opt/max ranks differ")
        if any(not (a <= b <= c) for a, b, c in zip(self.min, self.opt, self.max)):
            raise ValueError(f"profile {self.name}: need min <= opt <= max on every axis")

    @classmethod
    def parse(cls, text: str) -> ShapeProfile:
        name, shapes = text.split("=", 1)
        dims = [tuple(int(d) for d in s.split("x")) for s in shapes.split(",")]
        if len(dims) != 3:
            raise ValueError(f"profile {text!r}: expected NAME=MIN,OPT,MAX")
        return cls(name, *dims)


def require_tensorrt():
    try:
        import tensorrt as trt
    except ImportError:
        raise TensorRTUnavailable("TensorRT is not installed (pip package `tensorrt`)") from None
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        raise TensorRTUnavailable("no CUDA GPU visible: a TensorRT plan must be built on the GPU it will run on")
    return trt


def target_gpu() -> dict[str, str]:
    """What a plan is specific to: the TensorRT version and the compute capability of the GPU it is built on (a plan
    runs only there). Part of the plan's cache key, so a stale plan is never reused."""
    trt = require_tensorrt()
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"tensorrt": trt.__version__, "compute_capability": f"{major}.{minor}"}


@producer("tensorrt-plan", environment=target_gpu)
def tensorrt_plan(out_dir: Path, onnx: Path, profiles: tuple[ShapeProfile, ...], fp16: bool) -> None:
    """`model.plan` built from `onnx` with one optimization profile over `profiles`."""
    build_plan(onnx, out_dir / "model.plan", list(profiles), fp16=fp16)


def build_plan(onnx_path: Path, plan_path: Path, profiles: list[ShapeProfile], fp16: bool = False,
               workspace_gib: int = 4) -> Path:
    trt = require_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_path).read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{onnx_path}: TensorRT could not parse the ONNX: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_gib << 30)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for p in profiles:
        profile.set_shape(p.name, p.min, p.opt, p.max)
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError(f"TensorRT failed to build an engine from {onnx_path}")
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(engine))
    return plan_path


def main(argv: list[str] | None = None) -> int:
    from tritonpack.cli import Parser

    parser = Parser(prog="python -m tritonpack.build.build_tensorrt", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", type=Path)
    parser.add_argument("plan", type=Path)
    parser.add_argument("--profile", action="append", type=ShapeProfile.parse, required=True)
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args(argv)
    try:
        build_plan(args.onnx, args.plan, args.profile, args.fp16)
    except TensorRTUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from tritonpack.cli import run_script

    sys.exit(run_script(main))
