"""The Triton container's own site-packages for the local tritonserver's python stubs.

In the container, numpy is installed into the system Python (`/usr/local/lib/python3.X/dist-packages`), and a
packed environment whose `pyvenv.cfg` includes the system site-packages imports it from there, after its own
packages. Here the stub's interpreter is a local one without numpy, so the local Triton starts its stubs with this
folder on PYTHONPATH and CONTAINER_SITE naming a folder holding the stand-in's numpy: a stub in such an
environment finds it after the environment's packages, as in the container; any other Python sees nothing. Stubs
for Python 3.11 and later start isolated (pybind11's isolated PyConfig: PYTHONPATH ignored), and environments for
those Pythons carry their own numpy (`envpack.EnvSpec.installed`).

Imported by the stub's Python at start (Python's `site` imports `sitecustomize`): standard library only.
"""

import os
import sys

CONTAINER_SITE = "TRITONPACK_CONTAINER_SITE"


def _includes_system_site() -> bool:
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg")) as cfg:
            lines = cfg.read().splitlines()
    except OSError:  # not a virtual environment: a conda one, or the stub's Python itself
        return False
    settings = dict(line.split("=", 1) for line in lines if "=" in line)
    return {k.strip(): v.strip() for k, v in settings.items()}.get("include-system-site-packages") == "true"


sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
if os.environ.get(CONTAINER_SITE) and _includes_system_site():
    sys.path.append(os.environ[CONTAINER_SITE])
