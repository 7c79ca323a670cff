"""A fetched GGUF model converted once into a transformers directory (safetensors + tokenizer.json).

Loading a GGUF file rebuilds the tokenizer from the GGUF vocabulary and dequantizes every tensor on
each load: about a minute for the 0.5B model on a 2-core CPU, paid by every stage of a run. The
converted directory loads in seconds. It is derived only from a verified GGUF file, records that
file's sha256 and the sha256 of every file it holds, and is checked like the GGUF file itself: size
and modification time on every use, the hashes again whenever those changed.

Weights are stored in bfloat16: generation runs in it on GPUs and on CPUs, and the GGUF file holds
4-bit values whose dequantized form is what gets stored (rounded to bfloat16).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..runtime.io import atomic_write_json
from .integrity import ModelIntegrityError, file_sha256

if TYPE_CHECKING:  # the package's __init__ fetches the models and calls this module
    from . import FetchableModel

CONVERTED_DIR = "transformers"
RECORD = "converted.json"
STORED_DTYPE = "bfloat16"


def converted_dir(gguf_path: Path) -> Path:
    return gguf_path.parent / CONVERTED_DIR


def _file_entries(directory: Path, *, hashed: bool) -> dict[str, dict]:
    entries = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != RECORD:
            stat = path.stat()
            entries[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
            if hashed:
                entries[path.name]["sha256"] = file_sha256(path)
    return entries


def _read_record(directory: Path) -> Optional[dict]:
    try:
        return json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return None


def checked_converted_dir(model: FetchableModel, gguf_path: Path) -> Optional[Path]:
    """The converted directory of ``model`` if it exists and matches its record; None if absent.

    Raises ``ModelIntegrityError`` when a file changed since the conversion (hashes differ).
    """
    directory = converted_dir(gguf_path)
    record = _read_record(directory)
    if record is None or record.get("gguf_sha256") != model.sha256:
        return None
    recorded = record["files"]
    current = _file_entries(directory, hashed=False)
    if set(current) != set(recorded):
        raise ModelIntegrityError(
            f"{directory}: files differ from the conversion record ({sorted(set(current) ^ set(recorded))}); "
            f"delete the folder and run `python -m extensions.models fetch {model.name}` again"
        )
    stale = [name for name, entry in current.items()
             if (entry["size"], entry["mtime_ns"]) != (recorded[name]["size"], recorded[name]["mtime_ns"])]
    for name in stale:
        digest = file_sha256(directory / name)
        if digest != recorded[name]["sha256"]:
            raise ModelIntegrityError(
                f"{directory / name}: sha256 {digest} differs from the one recorded at conversion; "
                f"delete {directory} and run `python -m extensions.models fetch {model.name}` again"
            )
    if stale:
        _write_record(directory, model, {name: {**_file_entries(directory, hashed=False)[name],
                                                "sha256": recorded[name]["sha256"]} for name in recorded})
    return directory


def _write_record(directory: Path, model: FetchableModel, files: dict[str, dict]) -> None:
    import transformers

    record = {"model": model.name, "gguf_sha256": model.sha256, "dtype": STORED_DTYPE,
              "transformers": transformers.__version__, "files": files}
    atomic_write_json(directory / RECORD, record, indent=1, sort_keys=False, default=None)


def _require_gguf_reader() -> None:
    # transformers reads GGUF through the gguf package and, without it, fails deep in its loader.
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("converting a GGUF file needs the gguf package (pip install 'gguf>=0.10', "
                           "listed in requirements.txt)") from exc


def convert(model: FetchableModel, gguf_path: Path) -> Path:
    """Write the transformers directory of a verified GGUF file; its path."""
    _require_gguf_reader()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = converted_dir(gguf_path)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                  dtype=getattr(torch, STORED_DTYPE))
    # The GGUF loader leaves its quantizer attached, and save_pretrained then refuses to write; the
    # weights are plain dequantized tensors by now.
    loaded.hf_quantizer = None
    if hasattr(loaded.config, "quantization_config"):
        del loaded.config.quantization_config
    loaded.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    _write_record(staging, model, _file_entries(staging, hashed=True))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target
