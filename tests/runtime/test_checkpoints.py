import json

from extensions.runtime import checkpoints
from extensions.runtime.paths import RunPaths, checkpoint_index


def _make(path, step, payload=b"weights"):
    path.mkdir(parents=True)
    (path / "adapter.bin").write_bytes(payload * step)
    checkpoints.write_meta(path, stage="sft", config="c.yaml", base_model="m", data="d", step=step)
    return path


def test_paths_follow_the_run_layout(tmp_path):
    paths = RunPaths(tmp_path)
    assert paths.sft_train == tmp_path / "data" / "processed" / "sft_train.jsonl"
    assert paths.sft_checkpoint(40) == tmp_path / "checkpoints" / "sft" / "checkpoint-40"
    assert paths.rl_round(3) == tmp_path / "checkpoints" / "rl" / "round-003"
    assert paths.final("rl") == tmp_path / "checkpoints" / "rl" / "final"
    assert paths.eval_report("sft") == tmp_path / "outputs" / "eval_sft.json"
    assert checkpoint_index(paths.rl_round(12)) == 12
    assert checkpoint_index(paths.final("sft")) is None


def test_checkpoint_is_complete_only_after_manifest(tmp_path):
    ckpt = _make(tmp_path / "sft" / "checkpoint-5", 5)
    assert not checkpoints.is_complete(ckpt)
    manifest = checkpoints.finalize(ckpt)
    assert set(manifest["files"]) == {"adapter.bin", "meta.json"}
    assert checkpoints.is_complete(ckpt, verify_hashes=True)
    (ckpt / "adapter.bin").write_bytes(b"truncated")
    assert not checkpoints.is_complete(ckpt)


def test_hash_check_catches_same_size_corruption(tmp_path):
    ckpt = _make(tmp_path / "sft" / "checkpoint-1", 1, b"abcd")
    checkpoints.finalize(ckpt)
    (ckpt / "adapter.bin").write_bytes(b"abce")
    assert checkpoints.is_complete(ckpt)
    assert not checkpoints.is_complete(ckpt, verify_hashes=True)


def test_newest_complete_skips_partial_and_prune_keeps_newest(tmp_path):
    stage = tmp_path / "sft"
    for step in (2, 4, 6):
        checkpoints.finalize(_make(stage / f"checkpoint-{step}", step))
    _make(stage / "checkpoint-8", 8)  # killed before its manifest
    assert checkpoints.newest_complete(stage).name == "checkpoint-6"
    removed = checkpoints.prune(stage, keep_last=1)
    assert [p.name for p in removed] == ["checkpoint-2", "checkpoint-4"]
    assert checkpoints.newest_complete(stage).name == "checkpoint-6"
    assert (stage / "checkpoint-8").exists()  # incomplete ones are not pruned here


def test_copy_checkpoint_to_final(tmp_path):
    source = _make(tmp_path / "rl" / "round-002", 2)
    checkpoints.finalize(source)
    final = tmp_path / "rl" / "final"
    checkpoints.copy_checkpoint(source, final)
    assert checkpoints.is_complete(final, verify_hashes=True)
    assert json.loads((final / "meta.json").read_text())["step"] == 2
