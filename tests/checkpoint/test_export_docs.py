"""docs/checkpointing.md against a real checkpoint of a run on a prepared dataset (a vocabulary that
is not the preset's): its export example loads the weights, and its meta.json sample names the
train-state parts a checkpoint really holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.checkpoint.conftest import REPO, cli_env
from tests.data.conftest import paragraphs
from tests.helpers import invoke

DOC = (REPO / "docs" / "checkpointing.md").read_text()


def test_the_export_example_loads_a_checkpoint_trained_on_a_prepared_dataset(tmp_path, monkeypatch):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs(0, 150)))
    prepared = invoke(["data", "prepare", str(src), "--out", str(tmp_path / "data"), "--tokenizer", "bpe:384"])
    assert prepared.exit_code == 0, prepared.stderr
    ckpt = tmp_path / "ckpt"
    sets = [
        "model.preset='tiny'",
        "train.steps=1",
        "train.global_batch_size=2",
        "train.seq_len=32",
        f"data.path='{tmp_path / 'data'}'",
        f"checkpoint.dir='{ckpt}'",
    ]
    r = subprocess.run(  # one plain process of the engine: no launcher needed for a single rank
        [sys.executable, "-m", "distlaunch.engine", *(arg for s in sets for arg in ("--set", s))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cli_env()},
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    exported = invoke(["checkpoint", "export", str(ckpt), str(tmp_path / "model.safetensors")])
    assert exported.exit_code == 0, exported.stderr
    meta = json.loads((ckpt / "step_000001" / "meta.json").read_text())
    assert meta["data"]["vocab_size"] == 384  # not the tiny preset's 256: the preset alone cannot load it

    example = re.search(r"loadable into the plain model.*?```python\n(.*?)```", DOC, re.S).group(1)
    monkeypatch.chdir(tmp_path)  # the example reads model.safetensors from the current folder
    namespace: dict = {}
    exec(example.replace("/shared/run1/step_000020/meta.json", str(ckpt / "step_000001" / "meta.json")), namespace)
    assert namespace["model"].tok_emb.weight.shape[0] == 384

    sample = re.search(r'"extras": (\[.*?\])', DOC).group(1)  # the meta.json sample
    assert json.loads(sample) == meta["extras"]
    assert "data_position" in meta["extras"]
