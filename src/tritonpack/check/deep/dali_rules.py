"""`dali`: the DALI backend's rules (dali_backend/src/config_tools/config_tools.cc `ValidateConfig`, dali_model.h,
dali_model_instance.h, parameters.h; README "Tips & Tricks").

The backend lists the pipeline's `external_source` operators and outputs (with the dtype and ndim they declare)
and validates the config against them at load. Both forms are read here without a GPU: `model.dali` is parsed as
the serialized `PipelineDef` protobuf; `dali.py` is imported as the backend does and its single `@autoserialize`
pipeline serialized with `device_id=None`, which needs no CUDA even for mixed decoding. A CPU pipeline then runs
once on a real JPEG image.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import sys

import numpy as np

from tritonpack.check.deep.model import (
    DYNAMIC_SIZE,
    DeepModel,
    Findings,
    compare_trial_outputs,
    error_text,
    shape_text,
)
from tritonpack.spec import NUMPY_DTYPES

GPU_DEVICES = frozenset({"gpu", "mixed"})


@functools.cache
def _pipeline_def_class():
    """`dali_proto.PipelineDef` (dali/pipeline/proto/dali.proto) built from its field numbers: the fields read
    here are stable since DALI 1.0, and DALI's Python package ships no generated module for it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    one, many = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    schema = {
        "Argument": [("name", 1, f.TYPE_STRING, one), ("ints", 4, f.TYPE_INT64, many),
                     ("strings", 5, f.TYPE_STRING, many)],
        "InputOutput": [("name", 1, f.TYPE_STRING, one), ("device", 2, f.TYPE_STRING, one),
                        ("dtype", 5, f.TYPE_INT32, one), ("ndim", 6, f.TYPE_INT32, one)],
        "OpDef": [("name", 1, f.TYPE_STRING, one), ("input", 2, "InputOutput", many),
                  ("output", 3, "InputOutput", many), ("args", 4, "Argument", many),
                  ("inst_name", 5, f.TYPE_STRING, one)],
        "PipelineDef": [("num_threads", 1, f.TYPE_INT64, one), ("batch_size", 2, f.TYPE_INT32, one),
                        ("op", 5, "OpDef", many), ("pipe_outputs", 7, "InputOutput", many)],
    }
    file = descriptor_pb2.FileDescriptorProto(name="tritonpack_dali_pipeline.proto", package="tritonpack_dali",
                                              syntax="proto2")
    for message, fields in schema.items():
        m = file.message_type.add(name=message)
        for name, number, kind, label in fields:
            field = m.field.add(name=name, number=number, label=label)
            if isinstance(kind, str):
                field.type, field.type_name = f.TYPE_MESSAGE, f".tritonpack_dali.{kind}"
            else:
                field.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tritonpack_dali.PipelineDef"))


def _args(op) -> dict:
    return {a.name: (list(a.strings) or list(a.ints)) for a in op.args}


def _triton_type(dali_type: int) -> str:
    from nvidia.dali.types import DALIDataType

    name = DALIDataType(dali_type).name
    return {"FLOAT": "TYPE_FP32", "FLOAT16": "TYPE_FP16", "FLOAT64": "TYPE_FP64", "STRING": "TYPE_STRING"}.get(
        name, f"TYPE_{name}")


def serialized_from_source(model: DeepModel, out: Findings) -> bytes | None:
    """What the backend's autoserialize makes of a `.py` pipeline: import it under the name it uses, find exactly
    one `@autoserialize` function and serialize its pipeline (here with `device_id=None`: no GPU needed)."""
    from nvidia.dali._utils.autoserialize import _discover_autoserialize

    module_name = "autoserialize_mod"
    spec = importlib.util.spec_from_file_location(module_name, model.artifact)
    module = importlib.util.module_from_spec(spec)
    saved, sys.modules[module_name] = sys.modules.get(module_name), module
    keep_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # nothing written beside the source
    try:
        spec.loader.exec_module(module)
        functions = _discover_autoserialize(module, visited=[])
        if len(functions) != 1:
            out.load_fails("file", f"Precisely one autoserialize function must exist in the module. Found "
                                   f"{len(functions) or 'none'}.")
            return None
        return functions[0](device_id=None).serialize()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - what the pipeline source raises fails the backend's load
        # (an exit too: it would end the check, unreported, with the source's exit status)
        out.load_fails("file", f"autoserializing the pipeline fails: {type(e).__name__}: {error_text(e)}")
        return None
    finally:
        sys.dont_write_bytecode = keep_bytecode
        if saved is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = saved


def check_dali(model: DeepModel, out: Findings) -> None:
    import nvidia.dali  # noqa: F401 - without DALI nothing here can run: reported as not checked

    from_source = model.artifact.suffix == ".py"
    serialized = serialized_from_source(model, out) if from_source else model.artifact.read_bytes()
    if serialized is None:
        return
    try:
        pipeline = _pipeline_def_class().FromString(serialized)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError: not a serialized pipeline
        out.load_fails("file", f"not a serialized DALI pipeline: {error_text(e)}")
        return
    before = len(out.problems)
    sources = {(_args(op).get("name") or [op.inst_name])[0]: op for op in pipeline.op if op.name == "ExternalSource"}
    _check_inputs(model, out, sources)
    _check_outputs(model, out, list(pipeline.pipe_outputs))
    on_gpu = any(_args(op).get("device", ["cpu"])[0] in GPU_DEVICES for op in pipeline.op)
    _check_device_and_threads(model, out, on_gpu)
    if len(out.problems) > before:
        return
    if on_gpu:
        out.not_checked("run", "a GPU pipeline (mixed or gpu operators): its external_source names, declared dtypes "
                               "and output count were checked; it was not run, which needs CUDA")
    else:
        _trial_run(model, out, serialized)


def _declared_shape_problem(tensor, ndim: int, batched: bool) -> str | None:
    """`MatchShapes`: the config's dims against the ndim the pipeline declares (plus the batch when unbatched)."""
    expected = ndim + (0 if batched else 1)
    if len(tensor.dims) != expected:
        return (f"Mismatch in number of dimensions for \"{tensor.name}\": {len(tensor.dims)} defined in config "
                f"({shape_text(tensor.dims)}), {expected} in pipeline")
    return None


def _check_inputs(model: DeepModel, out: Findings, sources: dict) -> None:
    configured = {t.name: t for t in model.inputs}
    for name in sorted(configured.keys() - sources.keys()):
        out.load_fails(f"input[{name}]", f"Configuration file contains config for {name} but such input is not "
                                         f"present in the pipeline (external_source names: "
                                         f"{', '.join(sorted(sources)) or 'none'})")
    for name in sorted(sources.keys() - configured.keys()):
        out.load_fails("input", f"Missing config for \"{name}\" input (an external_source of the pipeline)")
    for name in sorted(configured.keys() & sources.keys()):
        tensor, args = configured[name], _args(sources[name])
        if args.get("dtype") and (declared := _triton_type(args["dtype"][0])) != tensor.data_type:
            out.load_fails(f"input[{name}].data_type", f"Mismatch of data_type config for \"{name}\": "
                                                       f"{tensor.data_type} in config, {declared} in pipeline")
        if args.get("ndim") and (reason := _declared_shape_problem(tensor, args["ndim"][0],
                                                                   model.max_batch_size != 0)):
            out.load_fails(f"input[{name}].dims", reason)


def _check_outputs(model: DeepModel, out: Findings, outputs: list) -> None:
    if len(outputs) != len(model.outputs):
        out.load_fails("output", f"The number of outputs specified in the DALI pipeline and the configuration file "
                                 f"do not match. Model config outputs: {len(model.outputs)}, Pipeline outputs: "
                                 f"{len(outputs)}")
        return
    for tensor, declared in zip(model.outputs, outputs):
        if declared.HasField("dtype") and declared.dtype >= 0 and _triton_type(declared.dtype) != tensor.data_type:
            out.load_fails(f"output[{tensor.name}].data_type", f"Mismatch of data_type config for "
                                                               f"\"{tensor.name}\": {tensor.data_type} in config, "
                                                               f"{_triton_type(declared.dtype)} in pipeline")
        if declared.HasField("ndim") and declared.ndim >= 0 and (
                reason := _declared_shape_problem(tensor, declared.ndim, model.max_batch_size != 0)):
            out.load_fails(f"output[{tensor.name}].dims", reason)


def _check_device_and_threads(model: DeepModel, out: Findings, on_gpu: bool) -> None:
    kinds = model.instance_kinds
    if on_gpu and "KIND_CPU" in kinds:
        out.load_fails("instance_group.kind", "the pipeline has GPU operators (mixed decoding or device='gpu'), "
                                              "but a KIND_CPU instance builds it without a GPU "
                                              "(CPU_ONLY_DEVICE_ID), which fails")
    elif not on_gpu and kinds == {"KIND_GPU"}:
        out.warning("instance_group.kind", "a CPU-only pipeline on KIND_GPU: it runs on the CPU all the same, and "
                                           "its outputs are copied to the GPU; use KIND_CPU, or mixed decoding")
    threads = model.parameter("num_threads")
    if threads is not None and not (threads.strip().lstrip("-").isdigit() and (int(threads) > 0 or
                                                                              int(threads) == -1)):
        out.load_fails("parameters.num_threads", f"{threads!r} is not a positive number of CPU threads (the backend "
                                                 f"reads it as an integer)")


@functools.cache
def sample_jpeg() -> bytes:
    """A small real JPEG (64x48 colour gradient): what an image pipeline's decoder must accept."""
    from PIL import Image

    y, x = np.mgrid[0:48, 0:64]
    pixels = np.stack([x * 4, y * 5, (x + y) * 2], axis=-1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _trial_run(model: DeepModel, out: Findings, serialized: bytes) -> None:
    from nvidia.dali import Pipeline

    def sample(tensor) -> np.ndarray:
        """One sample (DALI feeds lists of samples); dims of an unbatched model start with the batch."""
        dims = tensor.dims if model.max_batch_size > 0 else tensor.dims[1:]
        if tensor.data_type == "TYPE_UINT8" and len(dims) == 1:  # encoded bytes, as image clients send them
            return np.frombuffer(sample_jpeg(), dtype=np.uint8)
        return np.ones(tuple(DYNAMIC_SIZE if d == -1 else d for d in dims), dtype=NUMPY_DTYPES[tensor.data_type])

    threads = int(model.parameter("num_threads") or 1)
    try:
        pipe = Pipeline.deserialize(serialized_pipeline=serialized, batch_size=max(1, model.max_batch_size),
                                    num_threads=max(1, threads), device_id=None, prefetch_queue_depth=1,
                                    exec_async=False, exec_pipelined=False)
        pipe.build()
        for tensor in model.inputs:
            pipe.feed_input(tensor.name, [sample(tensor)] * max(1, model.trial_batch))
        results = pipe.run()
    except Exception as e:  # noqa: BLE001 - DALI raises RuntimeError subclasses with multi-line text
        out.request_fails("run", f"DALI fails on a JPEG image and inputs shaped from the config: {error_text(e)}")
        return
    returned = {}
    for tensor, result in zip(model.outputs, results):
        value = np.asarray(result.at(0))
        returned[tensor.name] = ((len(result),) + value.shape, value.dtype.name)
    compare_trial_outputs(model, out, returned)
