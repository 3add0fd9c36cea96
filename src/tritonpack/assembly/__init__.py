"""Recipes rendered into model folders for a target: `assemble(recipe, request, cache)`."""

from __future__ import annotations

from tritonpack.assembly import image, text
from tritonpack.cache import ArtifactCache
from tritonpack.components import ModelFolder
from tritonpack.ensembles import ImageRecipe, Recipe


def assemble(recipe: Recipe, request, cache: ArtifactCache) -> list[ModelFolder]:
    return (image if isinstance(recipe, ImageRecipe) else text).assemble(recipe, request, cache)
