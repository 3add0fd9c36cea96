"""`tensorflow_graphdef`: the TensorFlow backend's rules (tensorflow_backend/src/tensorflow.cc, namespace graphdef;
mirror/tensorflow_backend_tf.cc for what counts as an input or output).

A graphdef declares no signature: at load the backend takes every `Placeholder` node as a possible input and every
other node as a possible output, and checks only names and the input count. Dtypes and shapes are TensorFlow's to
check when the first request is fed to the placeholders; the trial run does that on the CPU.
"""

from __future__ import annotations

from tritonpack.check.deep.model import (
    DeepModel,
    Findings,
    compare_trial_outputs,
    dims_mismatch,
    error_text,
    triton_type,
)
from tritonpack.quiet_tensorflow import import_tensorflow


def _numpy_name(tf, dtype) -> str:
    dtype = tf.as_dtype(dtype)
    return "object" if dtype == tf.string else dtype.name


def check_graphdef(model: DeepModel, out: Findings) -> None:
    tf = import_tensorflow()  # its start-up notices are not findings

    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(model.artifact.read_bytes())
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends: not a graphdef
        out.load_fails("file", f"not a serialized TensorFlow GraphDef: {error_text(e)}")
        return
    placeholders = {n.name: n for n in graph_def.node if n.op == "Placeholder"}
    others = {n.name for n in graph_def.node if n.op != "Placeholder"}
    before = len(out.problems)
    if len(placeholders) < len(model.inputs):
        out.load_fails("input", f"configuration expects {len(model.inputs)} inputs, model provides at most "
                                f"{len(placeholders)}")
    for tensor in model.inputs:
        node = placeholders.get(tensor.name)
        if node is None:
            out.load_fails(f"input[{tensor.name}]", f"unexpected inference input '{tensor.name}', allowed inputs "
                                                    f"are: {', '.join(sorted(placeholders)) or '(no Placeholder)'}")
            continue
        data_type = triton_type(_numpy_name(tf, node.attr["dtype"].type))
        if data_type != tensor.data_type:
            out.request_fails(f"input[{tensor.name}].data_type", f"placeholder '{tensor.name}' takes {data_type}, "
                                                                 f"the config sends {tensor.data_type}")
        shape = tf.TensorShape(node.attr["shape"].shape)
        if shape.rank is not None and not tensor.ragged:
            dims = tuple(-1 if d is None else d for d in shape.as_list())
            if mismatch := dims_mismatch(dims, tensor, model.max_batch_size, exact=False):
                out.request_fails(f"input[{tensor.name}].dims", f"placeholder '{tensor.name}': {mismatch}")
    for tensor in model.outputs:
        if tensor.name not in others:
            out.load_fails(f"output[{tensor.name}]", f"unexpected inference output '{tensor.name}': no node of "
                                                     f"that name among the graph's {len(others)} non-Placeholder "
                                                     f"nodes")
    if len(out.problems) == before:
        _trial_run(model, out, tf, graph_def)


def _trial_run(model: DeepModel, out: Findings, tf, graph_def) -> None:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    feeds = {f"{t.name}:0": model.sample(t) for t in model.inputs}
    fetches = [f"{t.name}:0" for t in model.outputs]
    try:
        with tf.compat.v1.Session(graph=graph) as session:
            results = session.run(fetches, feeds)
    except Exception as e:  # noqa: BLE001 - whatever the session raises is what the first request gets
        out.request_fails("run", f"TensorFlow fails on inputs shaped from the config: {error_text(e)}")
        return
    compare_trial_outputs(model, out, {t.name: (r.shape, "object" if r.dtype.kind in "OSU" else r.dtype.name)
                                       for t, r in zip(model.outputs, results)})
