"""Export ResNet-50 as TorchScript (`model.pt`) and ONNX (`model.onnx`), both checked against the eager model.

    python build/export_resnet50.py OUT_DIR [--weights PATH] [--opset 17]

Weights, first that applies:
  --weights DIR    a transformers ResNet image-classification folder (e.g. a saved microsoft/resnet-50)
  --weights FILE   a torchvision ResNet-50 state dict (.pth); needs an importable torchvision
  (none)           torchvision's ImageNet weights if torchvision imports and has them cached, else the
                   transformers `ResNetConfig()` ResNet-50 (1000 classes), randomly initialised with SEED —
                   the same architecture and tensor contract, meaningless predictions.
Both artifacts take FP32 [batch, 3, 224, 224] NCHW (ImageNet mean/std normalised) and return FP32
[batch, 1000] logits; the batch axis is dynamic. TorchScript names follow pytorch_libtorch (INPUT__0 →
OUTPUT__0); the ONNX (and the TensorRT plan built from it) uses `input` → `output`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tritonpack.build import torchscript
from tritonpack.build.text_source import weights_problem
from tritonpack.cache import producer
from tritonpack.errors import SpecError

SEED = 0
CLASSES = 1000
IMAGE_SIZE = 224
MAX_REL_DIFF = 1e-4  # of the export against the eager forward, relative to the largest |logit|
ONNX_NAMES = ("input", "output")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def load_module(weights: str | None):
    """(eval-mode module returning logits, description of where the weights came from)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixels):
            return self.model(pixel_values=pixels).logits

    if weights and Path(weights).is_dir():
        from transformers import ResNetForImageClassification
        from transformers.utils import logging

        logging.disable_progress_bar()
        if problem := weights_problem(Path(weights)):
            raise SpecError(f"--weights {problem}")
        try:
            model = ResNetForImageClassification.from_pretrained(weights, local_files_only=True)
        except (OSError, ValueError) as e:  # no weights or config in the folder, or not a ResNet's
            raise SpecError(f"--weights {weights}: not a transformers ResNet folder ({_first_line(e)})") from None
        if model.config.num_labels != CLASSES:
            raise SpecError(f"--weights {weights}: {model.config.num_labels} classes, expected {CLASSES}")
        return Logits(model).eval(), f"transformers folder {weights}"
    if weights:
        resnet50 = _torchvision_resnet50()
        if resnet50 is None:
            raise SpecError(f"--weights {weights}: a state dict needs torchvision, which does not import here; "
                            "pass a transformers ResNet folder instead")
        model = resnet50()
        try:
            model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        except Exception as e:  # noqa: BLE001 - not a pickle, not weights only, or not a ResNet-50's tensors
            raise SpecError(f"--weights {weights}: not a torchvision ResNet-50 state dict ({_first_line(e)})") \
                from None
        return model.eval(), f"torchvision state dict {weights}"
    resnet50 = _torchvision_resnet50()
    if resnet50 is not None:
        try:
            from torchvision.models import ResNet50_Weights

            return resnet50(weights=ResNet50_Weights.IMAGENET1K_V2).eval(), "torchvision IMAGENET1K_V2"
        except Exception as e:  # noqa: BLE001 - offline or not cached: fall through to the random model
            print(f"torchvision weights unavailable ({type(e).__name__}); using a random ResNet-50", file=sys.stderr)
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(SEED)
    model = ResNetForImageClassification(ResNetConfig(num_labels=CLASSES))
    return Logits(model).eval(), f"transformers ResNetConfig() ResNet-50, random init, seed {SEED}"


def _torchvision_resnet50():
    try:
        from torchvision.models import resnet50
    except Exception:  # noqa: BLE001 - torchvision from the registry fails at import with the CPU torch here
        return None
    return resnet50


def check_batch(batch: int = 3) -> np.ndarray:
    rng = np.random.default_rng(SEED)
    return rng.standard_normal((batch, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)


def max_rel_diff(expected: np.ndarray, actual: np.ndarray) -> float:
    return float(np.abs(expected - actual).max() / max(np.abs(expected).max(), 1e-12))


@producer("resnet50", libraries=("torch", "transformers", "onnx"), code=(Path(torchscript.__file__),))
def resnet50(out_dir: Path, weights: Path | None, fmt: str) -> None:
    """`model.pt` (fmt torchscript) or `model.onnx` (fmt onnx) of ResNet-50 from `weights` (None: see the module)."""
    export(out_dir, str(weights) if weights else None, formats=(fmt,))


def export(out_dir: Path, weights: str | None = None, opset: int = 17,
           formats: tuple[str, ...] = ("torchscript", "onnx")) -> dict[str, Path]:
    """Write model.pt and/or model.onnx, and export.json, into out_dir; raises if an export differs from eager."""
    import onnxruntime as ort
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    module, origin = load_module(weights)
    pixels = check_batch()
    example = torch.from_numpy(pixels)
    with torch.inference_mode():
        expected = module(example).numpy()

    name_in, name_out = ONNX_NAMES
    diffs, paths = {}, {}
    with torchscript.quiet_tracing():  # the batch-3 comparisons below decide
        if "torchscript" in formats:
            paths["torchscript"] = out_dir / "model.pt"
            with torch.no_grad():
                torchscript.save(torch.jit.trace(module, example[:1], strict=False), paths["torchscript"])
            with torch.inference_mode():
                traced = torch.jit.load(str(paths["torchscript"]))(example).numpy()
            diffs["torchscript"] = max_rel_diff(expected, traced)
        if "onnx" in formats:
            paths["onnx"] = out_dir / "model.onnx"
            torch.onnx.export(module, (example[:1],), str(paths["onnx"]), input_names=[name_in],
                              output_names=[name_out], dynamic_axes={name_in: {0: "batch"}, name_out: {0: "batch"}},
                              opset_version=opset, dynamo=False)
            session = ort.InferenceSession(str(paths["onnx"]), providers=["CPUExecutionProvider"])
            diffs["onnx"] = max_rel_diff(expected, session.run(None, {name_in: pixels})[0])
    for name, diff in diffs.items():
        if not diff <= MAX_REL_DIFF:
            raise RuntimeError(f"{name} export of ResNet-50 differs from eager by {diff:.2e} > {MAX_REL_DIFF}")
    (out_dir / "export.json").write_text(json.dumps({"weights": origin, "opset": opset, "max_rel_diff": diffs},
                                                    indent=2) + "\n")
    print(f"exported ResNet-50 ({origin}): max rel diff {diffs}")
    return paths
def main(argv: list[str] | None = None) -> int:
    from tritonpack.cli import Parser

    parser = Parser(prog="python -m tritonpack.build.export_resnet50", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--weights")
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args(argv)
    export(args.out_dir, args.weights, args.opset)
    return 0


if __name__ == "__main__":
    from tritonpack.cli import run_script

    sys.exit(run_script(main))
