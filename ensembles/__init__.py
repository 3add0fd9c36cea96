"""Ensemble recipes by name. Each module has NAME, TARGETS and `models(request, cache) -> [ModelFolder]`."""

from __future__ import annotations

import importlib

from tritonpack.errors import SpecError

NAMES = ("bert", "bert_pt", "dali_inception", "resnet_pt", "resnet_trt")


def recipe(name: str):
    if name not in NAMES:
        raise SpecError(f"unknown ensemble {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")
