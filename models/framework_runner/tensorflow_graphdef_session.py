"""Run a frozen TensorFlow GraphDef with TensorFlow, as Triton's tensorflow_graphdef backend would.

Config tensor names are graph node names (`input`, `InceptionV3/Predictions/Softmax`); their first output
(`:0`) is fed and fetched. The graph is imported once and pruned to a concrete function.
"""

from __future__ import annotations

import numpy as np
from cpu_quota import cpu_limit


def open_session(path: str, params: dict[str, str]):
    import tensorflow as tf

    threads = int(params.get("threads", "0")) or cpu_limit()
    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TensorFlow already initialised in this process: keep its thread pools
            pass
    graph_def = tf.compat.v1.GraphDef()
    with open(path, "rb") as f:
        graph_def.ParseFromString(f.read())
    input_names = params["input_order"].split(",")
    output_names = params["output_order"].split(",")

    def imported():
        tf.compat.v1.import_graph_def(graph_def, name="")

    wrapped = tf.compat.v1.wrap_function(imported, [])
    tensor = wrapped.graph.get_tensor_by_name
    function = wrapped.prune([tensor(f"{n}:0") for n in input_names], [tensor(f"{n}:0") for n in output_names])

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = function(*(tf.constant(inputs[n]) for n in input_names))
        return {name: value.numpy() for name, value in zip(output_names, values)}

    return run
