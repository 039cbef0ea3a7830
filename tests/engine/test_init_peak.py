"""Every rank's init-time peak (the summary's ``init_peak_per_rank``) stays far below a whole model.

The ``small`` preset (~32M parameters, 122 MiB in fp32) at dp=4 ZeRO-3 against the same job in one
process, both through ``python -m distlaunch.engine`` for one step. A rank builds its model on the
meta device and materialises only its shards (``parallel/materialize.py``), so its peak resident
memory until the build is done is the one process's less about three quarters of the model, less
what a rank imports and starts besides (gloo, DTensor, FSDP: ~30 MiB), ~60 MiB all told; a rank
that built the whole model before sharding it would reach the one process's, or more. The bound
is a quarter of the model below the one process: the one process's own peak moves by ~8 MiB
between runs and virtual environments (410 and 418 MiB measured), so half a model, ~61 MiB, failed
a run whose ranks were as lean as ever. Both pay the same import of torch, which the comparison
cancels.
"""

from __future__ import annotations

import json
import sys

from distlaunch.engine.model import PRESETS, num_params
from tests.engine.harness import spawn_ok

JOB = ["model.preset='small'", "train.steps=1", "train.seq_len=64", "train.global_batch_size=4", "train.eval_every=0"]


def summary(tmp_path, world_size: int, extra: list[str]) -> dict:
    metrics = tmp_path / f"world{world_size}.jsonl"
    argv = [sys.executable, "-m", "distlaunch.engine", "--metrics-file", str(metrics)]
    for assignment in JOB + extra:
        argv += ["--set", assignment]
    spawn_ok(argv, world_size, timeout=240)
    return json.loads(metrics.read_text().splitlines()[-1])


def test_no_rank_peaks_at_a_whole_model_while_it_builds(tmp_path):
    one = summary(tmp_path, 0, [])["init_peak_per_rank"][0]["rss_bytes"]
    sharded = summary(tmp_path, 4, ["parallel.zero=3"])
    model_bytes = 4 * num_params(PRESETS["small"])
    peaks = [p["rss_bytes"] for p in sharded["init_peak_per_rank"]]
    print(f"init peak RSS: one process {one / 2**20:.0f} MiB, ranks {[round(p / 2**20) for p in peaks]} MiB")
    assert len(peaks) == 4 and all(p["rss_bytes"] for p in sharded["peak_per_rank"])
    for rank, peak in enumerate(peaks):
        assert peak <= one - model_bytes / 4, (rank, peak, one, model_bytes)
