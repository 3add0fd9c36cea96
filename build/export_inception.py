"""Inception v3 as a frozen TensorFlow graph (`model.graphdef`) and, optionally, the same graph as ONNX.

    python -m tritonpack.build.export_inception OUT_DIR [--graphdef inception_v3_2016_08_28_frozen.pb] [--onnx]

The contract is the official TF-slim frozen graph's: input `input` FP32 [batch, 299, 299, 3] NHWC scaled to
[-1, 1]; output `InceptionV3/Predictions/Softmax` FP32 [batch, 1001] (class 0 is "background").
  --graphdef FILE  the official frozen graph (or any graph with that contract); checked, then copied.
  (none)           Keras InceptionV3(weights=None, classes=1001), randomly initialised with SEED, frozen, with
                   its input and output renamed as in the original: same contract, meaningless predictions.
  --onnx           also convert the graph with tf2onnx to `model.onnx` (same tensor names), checked against
                   TensorFlow — for Triton containers without the TensorFlow backend (25.03 and later).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from tritonpack.cache import producer
from tritonpack.errors import SpecError
from tritonpack.quiet_tensorflow import import_tensorflow

SEED = 0
CLASSES = 1001
IMAGE_SIZE = 299
INPUT = "input"
OUTPUT = "InceptionV3/Predictions/Softmax"
MAX_REL_DIFF = 1e-4  # ONNX against TensorFlow, relative to the largest probability


def keras_graphdef():
    """A frozen Keras InceptionV3 GraphDef whose input/output nodes carry the TF-slim names."""
    tf = import_tensorflow()
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    tf.keras.utils.set_random_seed(SEED)
    model = tf.keras.applications.InceptionV3(weights=None, classes=CLASSES, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 3),
                                              classifier_activation="softmax")

    @tf.function(input_signature=[tf.TensorSpec([None, IMAGE_SIZE, IMAGE_SIZE, 3], tf.float32, name=INPUT)])
    def forward(images):
        return model(images, training=False)

    frozen = convert_variables_to_constants_v2(forward.get_concrete_function())
    graph_def = frozen.graph.as_graph_def()
    return _rename_output(graph_def, frozen.outputs[0].name.split(":")[0])


def _rename_output(graph_def, current: str):
    """Add `InceptionV3/Predictions/Softmax` as an Identity of the model's softmax node."""
    from tensorflow.core.framework import node_def_pb2, types_pb2

    node = node_def_pb2.NodeDef(name=OUTPUT, op="Identity", input=[current])
    node.attr["T"].type = types_pb2.DT_FLOAT
    graph_def.node.append(node)
    return graph_def


def load_graphdef(path: Path):
    tf = import_tensorflow()

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(Path(path).read_bytes())
    return graph_def


def check_contract(graph_def) -> None:
    names = {n.name: n for n in graph_def.node}
    if INPUT not in names or names[INPUT].op != "Placeholder":
        raise ValueError(f"no Placeholder named {INPUT!r}")
    if OUTPUT not in names:
        raise ValueError(f"no node named {OUTPUT!r}")


def given_graphdef(path: str):
    """The user's frozen graph, checked; one that does not parse or lacks the contract is a SpecError."""
    from google.protobuf.message import DecodeError

    try:
        graph_def = load_graphdef(Path(path))
        check_contract(graph_def)
    except (DecodeError, ValueError) as e:
        raise not_inception(path, (str(e).strip().splitlines() or [type(e).__name__])[0]) from None
    return graph_def


def not_inception(path: str, why: str) -> SpecError:
    return SpecError(f"--weights {path}: not a frozen TF-slim Inception v3 graph ({why})")


def run_graphdef(graph_def, images: np.ndarray) -> np.ndarray:
    tf = import_tensorflow()

    def imported():
        tf.compat.v1.import_graph_def(graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(imported, [])
    fn = wrapped.prune(wrapped.graph.get_tensor_by_name(f"{INPUT}:0"), wrapped.graph.get_tensor_by_name(f"{OUTPUT}:0"))
    return fn(tf.constant(images)).numpy()


def check_batch(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(SEED).uniform(-1, 1, (batch, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)


def to_onnx(graph_def, onnx_path: Path, opset: int = 17) -> None:
    """tf2onnx conversion; graph inputs/outputs renamed from `name:0` to the bare names Triton configs use."""
    import onnx
    import tf2onnx

    model, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=[f"{INPUT}:0"], output_names=[f"{OUTPUT}:0"],
                                              opset=opset)
    renames = {f"{INPUT}:0": INPUT, f"{OUTPUT}:0": OUTPUT}
    for node in model.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value in list(model.graph.input) + list(model.graph.output):
        value.name = renames.get(value.name, value.name)
    onnx.checker.check_model(model)
    onnx.save(model, str(onnx_path))


@producer("inception-v3", libraries=("tensorflow", "tensorflow-cpu", "tf2onnx", "onnx"))
def inception_v3(out_dir: Path, graphdef: Path | None, onnx: bool) -> None:
    """`model.graphdef` (the given frozen graph, checked, or the random Keras one) and with `onnx` its conversion."""
    export(out_dir, str(graphdef) if graphdef else None, onnx)


def export(out_dir: Path, graphdef: str | None = None, onnx: bool = False) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.graphdef"
    if graphdef:
        graph_def = given_graphdef(graphdef)
        shutil.copyfile(graphdef, target)
        origin = f"frozen graph {Path(graphdef).name}"
    else:
        graph_def = keras_graphdef()
        check_contract(graph_def)
        target.write_bytes(graph_def.SerializeToString())
        origin = f"Keras InceptionV3(weights=None, classes={CLASSES}), random init, seed {SEED}"
    images = check_batch()
    expected = run_graphdef(load_graphdef(target), images)
    if expected.shape != (len(images), CLASSES):
        why = f"output shape {expected.shape}, expected (batch, {CLASSES})"
        raise not_inception(graphdef, why) if graphdef else ValueError(f"{origin}: {why}")
    info = {"weights": origin}
    artifacts = {"graphdef": target}
    if onnx:
        import onnxruntime as ort

        to_onnx(graph_def, out_dir / "model.onnx")
        session = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        actual = session.run([OUTPUT], {INPUT: images})[0]
        diff = float(np.abs(expected - actual).max() / np.abs(expected).max())
        if not diff <= MAX_REL_DIFF:
            raise RuntimeError(f"ONNX conversion of Inception v3 differs from TensorFlow by {diff:.2e}")
        info["onnx_max_rel_diff"] = diff
        artifacts["onnx"] = out_dir / "model.onnx"
    (out_dir / "export.json").write_text(json.dumps(info, indent=2) + "\n")
    onnx_note = f", ONNX max rel diff {info['onnx_max_rel_diff']:.1e}" if onnx else ""
    print(f"exported Inception v3 ({origin}){onnx_note}")
    return artifacts


def main(argv: list[str] | None = None) -> int:
    from tritonpack.cli import Parser

    parser = Parser(prog="python -m tritonpack.build.export_inception", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--graphdef", help="frozen TF-slim graph, e.g. inception_v3_2016_08_28_frozen.pb")
    parser.add_argument("--onnx", action="store_true", help="also write model.onnx (tf2onnx)")
    args = parser.parse_args(argv)
    export(args.out_dir, args.graphdef, args.onnx)
    return 0


if __name__ == "__main__":
    from tritonpack.cli import run_script

    sys.exit(run_script(main))
