"""tritonpack: build, check, serve and package Triton ensembles as SageMaker multi-model endpoint tarballs.

The design card's folders stay at the top of the repository (`ensembles/` recipes, `build/` artifact producers,
`pipelines/` DALI pipelines, `models/` python-backend model sources, `envs/` environment definitions). They are
reached as `tritonpack.ensembles`, `tritonpack.build` and `tritonpack.pipelines`, so nothing but `tritonpack` is
installed as a top-level name: a wheel carries the folders inside the package (pyproject.toml), a checkout keeps
them where they are and the finder below maps the three names onto them.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_CARD_PACKAGES = ("ensembles", "build", "pipelines")
# Where models/, envs/ and the card packages live: inside the package when installed from a wheel, else the checkout.
CARD_ROOT = _PACKAGE_DIR if (_PACKAGE_DIR / "models").is_dir() else _PACKAGE_DIR.parent.parent


class _CardFolders(importlib.abc.MetaPathFinder):
    """`tritonpack.<folder>` → the checkout's top-level `<folder>/` (consulted after the normal finders)."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, folder = fullname.partition(".")
        if package != __name__ or folder not in _CARD_PACKAGES:
            return None
        init = CARD_ROOT / folder / "__init__.py"
        if not init.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


if CARD_ROOT != _PACKAGE_DIR and not any(isinstance(f, _CardFolders) for f in sys.meta_path):
    sys.meta_path.append(_CardFolders())
