"""Checkpoints are verified before they are trusted: checksums recorded at save and checked on
resume (a damaged newest checkpoint falls back to the previous one), ``checkpoint verify`` and
``inspect`` report damage, and a crafted ``.metadata`` pickle never runs code."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from distlaunch.training.checkpoint.folder import META_FILE
from distlaunch.training.checkpoint.manifest import read_meta
from tests.checkpoint.conftest import REPO, cli_env, engine_args
from tests.helpers import invoke, run_cli

NEWEST, PREVIOUS = "step_000020", "step_000015"


@pytest.fixture
def ckpt(reference, tmp_path) -> Path:
    """A private copy of the reference job's checkpoints (steps 15 and 20) to damage."""
    return Path(shutil.copytree(reference.ckpt, tmp_path / "ckpt"))


def resume(ckpt: Path, tmp_path: Path, steps: int = 21):
    """Continue the reference job for a step or two on 2 ranks; returns the finished CLI process."""
    args = engine_args(ckpt, tmp_path / "resumed.jsonl", f"train.steps={steps}")
    return run_cli("run", "--grace-period", "1", "-n", "2", *args, env=cli_env(), timeout=180, cwd=REPO)


def edit_meta(checkpoint: Path, **fields) -> None:
    """Rewrite fields of a checkpoint's meta.json."""
    meta = json.loads((checkpoint / META_FILE).read_text())
    meta.update(fields)
    (checkpoint / META_FILE).write_text(json.dumps(meta))


def forge_checksum(checkpoint: Path, name: str) -> None:
    """Record the current size and SHA-256 of ``name`` in meta.json, so the checksum step passes."""
    data = (checkpoint / name).read_bytes()
    files = json.loads((checkpoint / META_FILE).read_text())["files"]
    edit_meta(checkpoint, files={**files, name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}})


def flip_bytes(path: Path, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_manifest_records_size_and_sha256_of_every_file(reference):
    for step in (PREVIOUS, NEWEST):
        checkpoint = reference.ckpt / step
        files = read_meta(checkpoint).files
        on_disk = sorted(p.name for p in checkpoint.iterdir() if p.name != META_FILE)
        assert sorted(files) == on_disk and ".metadata" in files and "__1_0.distcp" in files
        for name, recorded in files.items():
            data = (checkpoint / name).read_bytes()
            assert recorded.bytes == len(data) and recorded.sha256 == hashlib.sha256(data).hexdigest()
    ok = invoke(["checkpoint", "verify", str(reference.ckpt)])
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert f"ok {reference.ckpt / PREVIOUS} (3 files" in ok.stdout and f"ok {reference.ckpt / NEWEST}" in ok.stdout


def test_flipped_bytes_in_a_weight_shard_fall_back_to_the_previous_checkpoint(ckpt, tmp_path):
    flip_bytes(ckpt / NEWEST / "__1_0.distcp")
    verified = invoke(["checkpoint", "verify", str(ckpt)])
    assert verified.exit_code == 1
    assert f"damaged {ckpt / NEWEST}: __1_0.distcp does not match its SHA-256" in verified.stdout
    assert f"ok {ckpt / PREVIOUS}" in verified.stdout
    one = invoke(["checkpoint", "verify", str(ckpt / PREVIOUS), "--json"])
    assert one.exit_code == 0 and json.loads(one.stdout)["checkpoints"][0]["problems"] == []

    exported = invoke(["checkpoint", "export", str(ckpt / NEWEST), str(tmp_path / "w.safetensors")])
    assert exported.exit_code == 1 and not (tmp_path / "w.safetensors").exists()
    assert "__1_0.distcp does not match its SHA-256" in exported.stderr and "Traceback" not in exported.stderr

    r = resume(ckpt, tmp_path, steps=16)  # the newest is step 20: resuming means step 15, so 16 is one more step
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    notice = [line for line in r.stderr.splitlines() if "is damaged" in line]
    assert len(notice) == 1, r.stderr
    assert f"checkpoint {ckpt / NEWEST} is damaged: __1_0.distcp does not match its SHA-256" in notice[0]
    assert notice[0].endswith(f"falling back to {PREVIOUS}")
    assert f"resumed from {ckpt / PREVIOUS} (step 15" in r.stdout and "Traceback" not in r.stderr


def _truncate(checkpoint: Path) -> str:
    shard = checkpoint / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    return "__0_0.distcp has 1000 bytes, the manifest recorded"


def _garbage_meta(checkpoint: Path) -> str:
    (checkpoint / META_FILE).write_bytes(b"\x00garbage{")
    return "meta.json is not a valid manifest"


def _garbage_index(checkpoint: Path) -> str:
    (checkpoint / ".metadata").write_bytes(b"not a pickle at all")
    return ".metadata has 19 bytes, the manifest recorded"


def _missing_shard(checkpoint: Path) -> str:
    (checkpoint / "__1_0.distcp").unlink()
    return "__1_0.distcp is missing"


def _shard_a_folder(checkpoint: Path) -> str:
    (checkpoint / "__1_0.distcp").unlink()
    (checkpoint / "__1_0.distcp").mkdir()  # there, but not a file: not "missing"
    return "__1_0.distcp is a directory, not a file"


def _negative_step(checkpoint: Path) -> str:
    edit_meta(checkpoint, step=-7)
    return "meta.json is not a valid manifest: step=-7: input should be greater than or equal to 1"


@pytest.mark.parametrize(
    "damage", [_truncate, _garbage_meta, _garbage_index, _missing_shard, _shard_a_folder, _negative_step]
)
def test_each_damage_is_one_clear_line_and_resume_falls_back(ckpt, tmp_path, damage):
    expected = damage(ckpt / NEWEST)
    inspected = invoke(["checkpoint", "inspect", str(ckpt / NEWEST)])
    assert inspected.exit_code == 0 and f"damaged {expected}" in inspected.stdout, inspected.stdout + inspected.stderr
    verified = invoke(["checkpoint", "verify", str(ckpt)])
    assert verified.exit_code == 1 and f"damaged {ckpt / NEWEST}: {expected}" in verified.stdout
    r = resume(ckpt, tmp_path, steps=16)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"checkpoint {ckpt / NEWEST} is damaged: {expected}" in r.stderr
    assert f"resumed from {ckpt / PREVIOUS} (step 15" in r.stdout


def _old_manifest_and_truncated_shard(checkpoint: Path) -> str:
    edit_meta(checkpoint, files={})  # as written before checksums existed: nothing to compare
    shard = checkpoint / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    return "__1_0.distcp has 1000 bytes, the index reads up to byte"


def _garbage_with_forged_checksum(checkpoint: Path) -> str:
    shard = checkpoint / "__1_0.distcp"
    shard.write_bytes(bytes(i * 7 % 251 for i in range(shard.stat().st_size)))  # same size, not a shard
    forge_checksum(checkpoint, "__1_0.distcp")
    return "__1_0.distcp"


@pytest.mark.parametrize("damage", [_old_manifest_and_truncated_shard, _garbage_with_forged_checksum])
def test_damage_that_passes_the_checksums_is_one_line_for_export_and_resume_falls_back(ckpt, tmp_path, damage):
    expected = damage(ckpt / NEWEST)
    exported = invoke(["checkpoint", "export", str(ckpt), str(tmp_path / "w.safetensors")])
    assert exported.exit_code == 1 and not (tmp_path / "w.safetensors").exists()
    assert exported.stderr.count("\n") == 1 and expected in exported.stderr, exported.stderr[-3000:]
    assert "Traceback" not in exported.stderr and "FrameSummary" not in exported.stderr
    r = resume(ckpt, tmp_path, steps=16)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    notice = [line for line in r.stderr.splitlines() if "is damaged" in line]
    assert len(notice) == 1 and len(notice[0]) < 400, r.stderr
    assert f"checkpoint {ckpt / NEWEST} is damaged: {expected}" in notice[0]
    assert notice[0].endswith(f"falling back to {PREVIOUS}") and "FrameSummary" not in r.stderr
    assert f"resumed from {ckpt / PREVIOUS} (step 15" in r.stdout


def test_a_step_named_explicitly_that_cannot_be_loaded_is_refused_not_replaced(ckpt, tmp_path):
    _garbage_with_forged_checksum(ckpt / NEWEST)
    args = engine_args(ckpt, tmp_path / "resumed.jsonl", "train.steps=21", f"checkpoint.resume='{ckpt / NEWEST}'")
    r = run_cli("run", "--grace-period", "1", "-n", "2", *args, env=cli_env(), timeout=180, cwd=REPO)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"checkpoint {ckpt / NEWEST} is damaged: __1_0.distcp" in r.stderr
    assert f"no intact checkpoint to resume from (tried {ckpt / NEWEST})" in r.stderr
    assert "falling back" not in r.stderr and "resumed from" not in r.stdout


def test_a_checkpoint_without_checksums_is_reported_unverified_and_still_exports(ckpt, tmp_path):
    edit_meta(ckpt / NEWEST, files={})
    verified = invoke(["checkpoint", "verify", str(ckpt / NEWEST)])
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert f"unverified {ckpt / NEWEST}: no checksums recorded" in verified.stdout
    assert "its 3 files could not be verified" in verified.stdout
    exported = invoke(["checkpoint", "export", str(ckpt / NEWEST), str(tmp_path / "w.safetensors")])
    assert exported.exit_code == 0 and (tmp_path / "w.safetensors").is_file()
    assert "no checksums recorded" in exported.stderr and "could not be verified" in exported.stderr


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"step": 7}, f"step=7, but the directory is {NEWEST}"),
        ({"layout": {"dp": 0, "tp": 1, "pp": 1, "zero": 0, "world_size": 2}}, "layout.dp=0: input should be greater"),
        (
            {"layout": {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "world_size": 3}},
            "layout: world_size 3 is not dp*tp*pp = 2",
        ),
        ({"format": 2}, "format=2: this distlaunch reads format 1 to 1"),
        ({"preset": ""}, "preset='': string should have at least 1 character"),
        ({"files": {"../../x": {"bytes": 1, "sha256": "0" * 64}}}, "files: '../../x' is not the name of a file"),
    ],
)
def test_a_bad_manifest_field_is_named_with_its_value(ckpt, fields, expected):
    edit_meta(ckpt / NEWEST, **fields)
    verified = invoke(["checkpoint", "verify", str(ckpt)])
    assert verified.exit_code == 1
    assert f"damaged {ckpt / NEWEST}: meta.json is not a valid manifest: {expected}" in verified.stdout, verified.stdout
    assert "validation error" not in verified.stdout


@pytest.mark.parametrize("named", [True, False], ids=["meta.json names the data", "an older meta.json"])
def test_resuming_on_data_with_another_vocabulary_is_refused_before_any_tensor_is_read(ckpt, tmp_path, named):
    """The ranks' own check (``run`` starts them whatever the checkpoint): from meta.json's data,
    or, in a checkpoint that does not record it, from the embedding's saved shape."""
    if not named:
        edit_meta(ckpt / NEWEST, data=None)
    data = tmp_path / "bpe384"
    corpus = REPO / "distlaunch" / "data" / "corpus.txt"
    prepared = invoke(["data", "prepare", str(corpus), "--out", str(data), "--tokenizer", "bpe:384"])
    assert prepared.exit_code == 0, prepared.stderr
    args = engine_args(ckpt, tmp_path / "resumed.jsonl", "train.steps=21", f"data.path='{data}'")
    r = run_cli("run", "--grace-period", "1", "-n", "2", *args, env=cli_env(), timeout=180, cwd=REPO)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    because = (
        "its vocabulary has 256 tokens, this model's has 384" if named else "it holds model.tok_emb.weight as 256x128"
    )
    assert f"checkpoint {ckpt / NEWEST} was trained on other data: {because}" in r.stderr
    assert "Size mismatch" not in r.stderr and "Traceback" not in r.stderr


def _pointer_to_a_missing_step(latest: Path) -> str:
    latest.write_text("step_000099\n")
    return "names step_000099, which does not exist"


def _pointer_symlink_loop(latest: Path) -> str:
    latest.unlink()
    latest.symlink_to(latest.name)
    return "is unreadable (a symlink loop)"


def _pointer_is_a_directory(latest: Path) -> str:
    latest.unlink()
    latest.mkdir()
    return "is a directory, not a pointer file"


def _pointer_is_a_pipe(latest: Path) -> str:
    latest.unlink()
    os.mkfifo(latest)  # once, every tool waited on it for a writer
    return "is not a regular file, not a pointer file"


def _pointer_to_a_step_without_meta(latest: Path) -> str:
    (latest.parent / "step_000099").mkdir()
    latest.write_text("step_000099\n")
    return "names step_000099, which has no meta.json (not a published checkpoint)"


def _empty_pointer(latest: Path) -> str:
    latest.write_text("")
    return "does not name a step_N directory ('')"


def _pointer_out_of_the_folder(latest: Path) -> str:
    latest.write_text("../\n")
    return "does not name a step_N directory ('../')"


@pytest.mark.timeout(120)  # a pointer the tools wait on fails here, not at the suite's limit
@pytest.mark.parametrize(
    "bad_pointer",
    [
        _pointer_to_a_missing_step,
        _pointer_symlink_loop,
        _pointer_is_a_directory,
        _pointer_is_a_pipe,
        _pointer_to_a_step_without_meta,
        _empty_pointer,
        _pointer_out_of_the_folder,
    ],
)
def test_a_bad_latest_pointer_is_the_same_warning_in_every_tool_and_verify_judges_the_checkpoints(
    ckpt, tmp_path, bad_pointer
):
    warning = f"{ckpt / 'latest'} {bad_pointer(ckpt / 'latest')}; using {NEWEST} instead"
    inspected = invoke(["checkpoint", "inspect", str(ckpt)])
    assert inspected.exit_code == 0 and f"warning {warning}" in inspected.stdout, inspected.stdout
    assert "step 20," in inspected.stdout and "damaged" not in inspected.stdout
    verified = invoke(["checkpoint", "verify", str(ckpt)])
    assert verified.exit_code == 0 and f"warning {warning}" in verified.stdout, verified.stdout
    assert f"ok {ckpt / NEWEST}" in verified.stdout and f"ok {ckpt / PREVIOUS}" in verified.stdout
    exported = invoke(["checkpoint", "export", str(ckpt), str(tmp_path / "w.safetensors"), "--json"])
    assert exported.exit_code == 0 and f"warning: {warning}" in exported.stderr, exported.stderr
    assert json.loads(exported.stdout)["source"] == str(ckpt / NEWEST)


def test_resume_names_a_pointer_it_cannot_follow_and_uses_the_newest_checkpoint(ckpt, tmp_path):
    warning = f"{ckpt / 'latest'} {_pointer_symlink_loop(ckpt / 'latest')}; using {NEWEST} instead"
    r = resume(ckpt, tmp_path, steps=21)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"warning: {warning}" in r.stderr
    assert f"resumed from {ckpt / NEWEST} (step 20" in r.stdout


def test_a_checkpoint_path_that_is_a_symlink_loop_or_dangling_says_so(tmp_path):
    loop, dangling = tmp_path / "loop", tmp_path / "dangling"
    loop.symlink_to(loop.name)
    dangling.symlink_to(tmp_path / "gone")
    for command in (["inspect"], ["verify"], ["export"]):
        extra = [str(tmp_path / "w.safetensors")] if command == ["export"] else []
        r = invoke(["checkpoint", *command, str(loop), *extra])
        assert r.exit_code == 2 and f"checkpoint path {loop} is a symlink loop" in r.stderr, r.stderr
        r = invoke(["checkpoint", *command, str(dangling), *extra])
        assert r.exit_code == 2 and f"is a symlink to {tmp_path / 'gone'}, which does not exist" in r.stderr


def test_a_non_utf8_latest_pointer_is_named_and_the_newest_checkpoint_is_used(ckpt, tmp_path):
    (ckpt / "latest").write_bytes(b"\xff\xfe\x00step")
    inspected = invoke(["checkpoint", "inspect", str(ckpt)])
    assert inspected.exit_code == 0 and f"warning {ckpt / 'latest'} is unreadable" in inspected.stdout
    assert invoke(["checkpoint", "verify", str(ckpt)]).exit_code == 0  # a bad pointer: every checkpoint is intact
    r = resume(ckpt, tmp_path, steps=21)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"warning: {ckpt / 'latest'} is unreadable (UnicodeDecodeError)" in r.stderr
    assert f"resumed from {ckpt / NEWEST} (step 20" in r.stdout


def test_verify_usage_errors_exit_2(tmp_path):
    missing = invoke(["checkpoint", "verify", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "checkpoint not found" in missing.stderr
    empty = invoke(["checkpoint", "verify", str(tmp_path)])
    assert empty.exit_code == 2 and "no published checkpoint" in empty.stderr


class _RunsCode:
    """A pickle that calls a function on load, as a crafted checkpoint index would."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code from the checkpoint ran"))


def _plant_code(checkpoint: Path, marker: Path) -> None:
    """Replace the index with a code-running pickle and forge its checksum, as an attacker would."""
    (checkpoint / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    forge_checksum(checkpoint, ".metadata")


def test_a_crafted_index_never_runs_code_on_export_verify_or_resume(ckpt, tmp_path):
    marker = tmp_path / "pwned"
    _plant_code(ckpt / NEWEST, marker)
    refused = "refused to load"
    exported = invoke(["checkpoint", "export", str(ckpt / NEWEST), str(tmp_path / "w.safetensors")])
    assert exported.exit_code == 1 and refused in exported.stderr and "pathlib.Path.write_text" in exported.stderr
    verified = invoke(["checkpoint", "verify", str(ckpt)])
    assert verified.exit_code == 1 and refused in verified.stdout
    assert not marker.exists()
    r = resume(ckpt, tmp_path, steps=16)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"checkpoint {ckpt / NEWEST} is damaged: {refused} {ckpt / NEWEST / '.metadata'}" in r.stderr
    assert f"resumed from {ckpt / PREVIOUS} (step 15" in r.stdout
    assert not marker.exists()
