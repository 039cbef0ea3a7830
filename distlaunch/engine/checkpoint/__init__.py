"""Sharded, atomic checkpoints that any layout can resume from (docs/checkpointing.md).

- ``folder``: the directory on disk: step names, the ``latest`` pointer, publishing, pruning (torch-free),
- ``manifest``: ``meta.json``, its format and its one-line reasons when it is wrong (torch-free),
- ``integrity``: checksums recorded at save and verified before a load (torch-free),
- ``resume``: which checkpoint a job resumes from; ``distlaunch train`` checks it before launch (torch-free),
- ``safe``: reading the index and shards without running code from them, one line per failure,
- ``shards``: model and optimizer state under single-process names, ready for DCP resharding,
- ``state``: registered train-state parts (LR schedule, loss scaler, ...) and per-rank RNG,
- ``store``: one atomic save, one load from any layout,
- ``session``: the training loop's hooks (resume, step watchdog, fault injection, saves),
- ``export``: one consolidated state dict for the plain single-process model.
"""
