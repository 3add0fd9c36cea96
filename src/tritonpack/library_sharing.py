"""Loaded models share the shared libraries of equal packed environments (installed into every packed env).

Triton's python backend unpacks each model's environment archive on its own, into a numbered folder of one
temporary folder per server (`/tmp/python_env_XXXXXX/<n>`). Two tarballs with the same environment on one MME
therefore map two copies of every library (OpenVINO's, tokenizers'), and the kernel keeps the pages of
each copy apart: 56 MB per additional loaded bert (docs/performance.md, thirteenth round). The packing writes an
index of the environment's shared objects with their SHA-256 (`INDEX`) and a `.pth` line that runs
`share_this_environment` at every interpreter start, before the stub imports numpy. In an unpacked environment
each indexed file is then hard-linked to one copy per content in a folder beside the environments (`STORE`): the
first environment to arrive lends its file, later ones replace theirs by a link to it (an atomic rename of a
file of the same bytes, so a process loading it meanwhile gets one or the other), and every stub maps the same
pages. Anywhere else (the packing's own import check, an environment Triton uses in place) it does nothing.

This file is copied into the environment, whose Python may be older than tritonpack's: standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MODULE = "_tritonpack_library_sharing"
INDEX = f"{MODULE}.json"  # beside the module in site-packages: {path relative to the env: sha256}
PTH_LINE = f"import {MODULE}; {MODULE}.share_this_environment()\n"
STORE = "tritonpack-shared-libraries"


def unpacked_by_triton(env_root: Path) -> bool:
    return env_root.name.isdigit() and env_root.parent.name.startswith("python_env_")


def share_libraries(env_root: Path, index: dict[str, str]) -> int:
    """Link each indexed file of `env_root` to the one copy of its content in the store beside it; returns the
    bytes now shared with an environment unpacked earlier."""
    if not unpacked_by_triton(env_root):
        return 0
    store = env_root.parent / STORE
    store.mkdir(mode=0o700, exist_ok=True)
    shared = 0
    for relative, digest in index.items():
        own, stored = env_root / relative, store / digest
        try:
            os.link(own, stored)  # the first environment to arrive lends its copy
            continue
        except FileExistsError:
            pass
        except OSError:
            continue
        try:
            size = own.stat().st_size
            if os.path.samefile(own, stored) or stored.stat().st_size != size:
                continue
            temporary = own.with_name(f".{own.name}.{os.getpid()}.shared")
            os.link(stored, temporary)
        except OSError:
            continue
        try:
            os.replace(temporary, own)
            shared += size
        except OSError:
            pass
        # rename does nothing where another stub of this environment linked `own` to the same copy meanwhile
        temporary.unlink(missing_ok=True)
    return shared


def share_this_environment() -> None:
    """The `.pth` hook: share this interpreter's environment's libraries; a failure costs memory, never the start."""
    try:
        index = json.loads(Path(__file__).with_name(INDEX).read_text())
        share_libraries(Path(sys.prefix), index)
    except (OSError, ValueError) as error:
        print(f"tritonpack: this environment's libraries are not shared with other models' ({error})",
              file=sys.stderr)
