"""Write model folders as a Triton model repository and pack it as a reproducible MME tarball."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import secrets
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from tritonpack.components import ModelFolder
from tritonpack.errors import UserError

MANIFEST = "manifest.json"
STEP_DIGEST_HEX = 12  # of the build's SHA-256, in the MME tarball's step names
FIXED_MTIME = 0  # tar entries and the gzip header carry no build time, so equal inputs give equal bytes


def reproducible_gzip(raw: BinaryIO, level: int) -> gzip.GzipFile:
    """A gzip writer over `raw` whose header names no file and no time: equal bytes in give equal bytes out."""
    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=FIXED_MTIME, compresslevel=level)


def write_repository(folders: Iterable[ModelFolder], out_dir: Path, manifest: Mapping | None = None,
                     top_files: Mapping[str, Path] | None = None, link: bool = False) -> Path:
    """Replace `out_dir` with one folder per model (`config.pbtxt` + files) and `top_files` beside them (Triton
    ignores files at the top of a repository); written beside, then swapped in. `link`: hard-link the files where
    the file system allows (a staging copy that is only packed)."""
    folders = list(folders)
    names = [f.spec.name for f in folders]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate model names in repository: {names}")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 kept a server in a container running as another user out of it
    try:
        for folder in folders:
            model_dir = staging / folder.spec.name
            model_dir.mkdir()
            (model_dir / "config.pbtxt").write_text(folder.spec.render())
            for relative, source in sorted(folder.files.items()):
                _place(Path(source), model_dir / relative, link)
            (model_dir / "1").mkdir(exist_ok=True)  # ensembles have an empty version folder
        for name, source in sorted((top_files or {}).items()):
            _place(Path(source), staging / name, link)
        if manifest is not None:
            artifacts = {str(p.relative_to(staging)): sha256_file(p)
                         for p in sorted(staging.rglob("*")) if p.is_file()}
            text = json.dumps({**manifest, "sha256": artifacts}, indent=2, sort_keys=True)
            (staging / MANIFEST).write_text(text + "\n")
        replace_folder(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def replace_folder(source: Path, target: Path) -> Path:
    """Put folder `source` at `target` (same file system). What was there is renamed aside and removed only once
    `source` is in place, so `target` is always whole, old or new, even where the old one cannot be removed (another
    user's files, a read-only mount inside it)."""
    source, target = Path(source), Path(target)
    if not target.exists():
        return source.rename(target)
    replaced = target.with_name(f".{target.name}-replaced-{secrets.token_hex(4)}")
    target.rename(replaced)
    try:
        source.rename(target)
    except BaseException:
        replaced.rename(target)
        raise
    try:
        shutil.rmtree(replaced)
    except OSError as e:
        raise UserError(f"{target} is replaced, but its previous contents, moved to {replaced}, could not all be "
                        f"removed ({e.strerror.lower()}): remove that folder as a user who may, then run the command "
                        f"again") from None
    return target


def distinct_step_names(folders: Iterable[ModelFolder], top_files: Mapping[str, Path] | None = None) -> dict[str, str]:
    """Each ensemble step's name in the MME tarball, `<name>_<digest>`: the digest is taken over the folders as they
    are packed (every config and file, the environment's `EXECUTION_ENV_PATH` and bytecode included) and the
    `top_files` beside them (the environment itself), so any difference in what a step runs renames it. The ensembles
    keep their names (an MME maps the target name onto the ensemble).

    Why, for MME tarballs: each loaded target is its own repository (Triton's model namespacing), but a load polls
    its steps by name in every repository, and a step of an earlier target found that way is loaded again when its
    folder changed since its own load (its stub wrote the model's bytecode there): with shared step names, loading
    a target reloaded the steps of the target loaded before it (new stubs, its encoder compiled again;
    docs/performance.md, sixteenth round). Builds whose step folders or environment differ get different names;
    equal builds keep equal names (the tarball stays reproducible; `envpack.with_bytecode` covers their copies)."""
    folders = list(folders)
    digest = hashlib.sha256()
    for folder in sorted(folders, key=lambda f: f.spec.name):
        digest.update(f"model {folder.spec.name}\n{folder.spec.render()}\n".encode())
        for relative, source in sorted(folder.files.items()):
            digest.update(f"{folder.spec.name}/{relative}:{sha256_file(Path(source))}\n".encode())
    for name, source in sorted((top_files or {}).items()):
        digest.update(f"{name}:{sha256_file(Path(source))}\n".encode())
    suffix = digest.hexdigest()[:STEP_DIGEST_HEX]
    return {f.spec.name: f"{f.spec.name}_{suffix}" for f in folders if not f.spec.is_ensemble}


def with_step_names(folders: Iterable[ModelFolder], names: Mapping[str, str]) -> list[ModelFolder]:
    """The folders with each step renamed as `names` says, and the ensembles' step references with them."""
    def renamed(spec):
        if spec.is_ensemble:
            return replace(spec, ensemble_steps=[replace(step, model_name=names.get(step.model_name, step.model_name))
                                                 for step in spec.ensemble_steps])
        return replace(spec, name=names.get(spec.name, spec.name))

    return [ModelFolder(renamed(f.spec), f.files) for f in folders]


def _place(source: Path, destination: Path, link: bool) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(source, destination)
            return
        except OSError:  # another file system: copy
            pass
    shutil.copyfile(source, destination)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
    return info


def write_tarball(repo_dir: Path, tar_path: Path) -> Path:
    """The repository's model folders at the top level of a gzip tarball, byte-for-byte reproducible."""
    repo_dir, tar_path = Path(repo_dir), Path(tar_path)
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own beside the target: concurrent builds of one name each write their own, then replace in turn
    handle, tmp = tempfile.mkstemp(prefix=f".{tar_path.name}-", suffix=".partial", dir=tar_path.parent)
    try:
        with open(handle, "wb") as raw, reproducible_gzip(raw, 6) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(repo_dir.rglob("*")):
                if path.is_symlink():
                    raise ValueError(f"{path}: links are not packed into MME tarballs")
                info = _normalised(tar.gettarinfo(str(path), arcname=str(path.relative_to(repo_dir))))
                if info.islnk():  # a hard link to a file packed before (e.g. a staging copy): pack its bytes again
                    info.type, info.linkname, info.size = tarfile.REGTYPE, "", path.stat().st_size
                if path.is_file():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the tarball from other users
        os.replace(tmp, tar_path)
    except BaseException:  # a full disk, a link: no partial tarball is left to fill it further
        Path(tmp).unlink(missing_ok=True)
        raise
    return tar_path
