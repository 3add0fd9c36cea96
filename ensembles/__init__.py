"""Ensemble recipes by name: small declarative objects (`TextRecipe`, `ImageRecipe`) that `tritonpack.builder`
renders for a target."""

from __future__ import annotations

from tritonpack.errors import SpecError

from . import bert, bert_pt, dali_inception, resnet_pt, resnet_trt
from .image import ImageRecipe
from .text import TextRecipe

Recipe = TextRecipe | ImageRecipe
RECIPES: dict[str, Recipe] = {m.RECIPE.name: m.RECIPE for m in (bert, bert_pt, dali_inception, resnet_pt, resnet_trt)}
NAMES = tuple(RECIPES)


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise SpecError(f"unknown ensemble {name!r}; known: {', '.join(NAMES)}")
    return RECIPES[name]
