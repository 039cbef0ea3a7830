"""Sharded, atomic checkpoints that any layout can resume from (docs/checkpointing.md). The folder's format
(step names, ``latest``, ``meta.json``, checksums, which one to resume) is torch-free, in
``distlaunch.training.checkpoint``; this package holds the torch side:

- ``safe``: reading the index and shards without running code from them, one line per failure,
- ``shards``: model and optimizer state under single-process names, ready for DCP resharding,
- ``state``: registered train-state parts (LR schedule, loss scaler, ...) and per-rank RNG,
- ``store``: one atomic save, one load from any layout,
- ``session``: the training loop's hooks (resume, step watchdog, fault injection, saves),
- ``export``: one consolidated state dict for the plain single-process model.
"""
