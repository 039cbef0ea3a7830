"""Which checkpoint a job resumes from, decided from directory listings and ``meta.json`` alone.

Torch-free on purpose: rank 0 decides with it (``session``), and ``distlaunch train`` runs the same
decision before any process starts (``check_before_launch``), so a ``--resume`` that cannot work is
one line and exit 2 instead of an error on every rank. The ranks still decide for themselves: on
several hosts they may see other files than the launcher.

``checkpoint.resume``:

- ``auto`` (default): the latest checkpoint in ``checkpoint.dir`` if there is one, else a fresh
  start. Re-running a command, a ``--max-restarts`` restart and a requeued Slurm job all continue.
- ``latest``: the same, but a first try with nothing to resume is an error.
- ``never``: a fresh run, in a ``checkpoint.dir`` that holds no checkpoint yet (among another run's
  checkpoints its saves would mix with theirs, and pruning would keep theirs, the higher steps); a
  restart continues this run from its own latest checkpoint, as ``auto`` does.
- a path (a ``step_N`` directory or a checkpoint root): that checkpoint on the first try; on a
  restart, this job's own latest checkpoint in ``checkpoint.dir`` once it has one.

A checkpoint already at ``train.steps`` leaves nothing to train (the job ends at once, exit 0); one
past it is refused (``steps_left``).
"""

from __future__ import annotations

from pathlib import Path

from distlaunch.data.source import FRESH_START, DataIdentity, check_same_data, data_file, data_fingerprint
from distlaunch.errors import UsageError
from distlaunch.readable import plural
from distlaunch.training.checkpoint.folder import (
    is_checkpoint,
    list_checkpoints,
    locate_checkpoint,
    read_latest,
    step_of,
)
from distlaunch.training.checkpoint.manifest import read_manifest
from distlaunch.training.config import ranks_path
from distlaunch.training.places import CHECKPOINT_DIR, check_not_in_use, check_place
from distlaunch.training.presets import model_config

RESUME_WORDS = ("auto", "latest", "never")


def steps_left(checkpoint: Path, step: int, steps: int) -> bool:
    """Whether a job of ``train.steps`` has steps left to train after resuming ``checkpoint`` (of
    ``step``). False when the checkpoint already reaches the last step: re-running a finished job's
    command, or a restart after its last save, has nothing left to do (``nothing_left``, exit 0). A
    checkpoint past the last step is refused (UsageError, exit 2): training on would run past the
    end the config asks for, and stopping would silently return a model of another step."""
    if step > steps:
        raise UsageError(
            f"checkpoint {checkpoint} is at step {step}, past train.steps={steps}",
            f"set train.steps above {step} to train on from it, {FRESH_START}",
        )
    return step < steps


def nothing_left(checkpoint: Path, step: int, steps: int) -> str:
    """The line of a resume that finds the checkpoint already at ``train.steps`` (``steps_left``)."""
    return (
        f"checkpoint {checkpoint} (step {step}) already reaches train.steps={steps}: nothing left to train "
        "(raise train.steps to train further)"
    )


def resume_source(resume: str, ckpt_dir: str | None, tries: int) -> tuple[Path | None, str | None]:
    """The checkpoint to resume from (None: start fresh), and the warning of a ``latest`` pointer
    that could not be followed on the way (None: no warning); see the module docstring."""
    if resume == "never" and tries == 0:
        found = list_checkpoints(Path(ckpt_dir).expanduser()) if ckpt_dir else []
        if found:
            names = found[0].name + (f" … {found[-1].name}" if len(found) > 1 else "")
            raise UsageError(
                f"checkpoint.resume='never' starts a fresh run, but checkpoint.dir {ckpt_dir} already holds "
                f"{plural(len(found), 'checkpoint')} of another run ({names}): the two would mix, and pruning keeps "
                "the newest steps, theirs",
                "give this run a new checkpoint.dir, or move those checkpoints away, or continue them with "
                "checkpoint.resume=auto",
            )
        return None, None
    own, warning = read_latest(Path(ckpt_dir).expanduser()) if ckpt_dir else (None, None)
    if resume == "never":
        return own, warning  # a restart: this run's own latest checkpoint (the first try found none)
    if resume == "auto":
        return own, warning
    if resume == "latest":
        if ckpt_dir is None:
            raise UsageError("checkpoint.resume='latest' needs checkpoint.dir", "set --set checkpoint.dir=PATH")
        if own is None and tries == 0:
            raise UsageError(
                f"nothing to resume: no published checkpoint in {ckpt_dir}",
                "check checkpoint.dir, or use checkpoint.resume='auto' to start fresh when empty",
            )
        return own, warning
    if tries > 0 and own is not None:
        return own, warning  # a restart continues from this job's newest progress, not the original PATH
    return locate_checkpoint(resume)


def resume_candidates(source: Path | None, resume: str, tries: int) -> list[Path]:
    """``source``, then the older published checkpoints beside it, newest first.

    A damaged checkpoint falls back to the next one, unless the user named that very ``step_N``
    directory (``checkpoint.resume=PATH`` on the first try): then only that one is a candidate.
    """
    if source is None:
        return []
    explicit = resume not in RESUME_WORDS and tries == 0 and is_checkpoint(Path(resume).expanduser())
    if explicit:
        return [source]
    step = step_of(source) or 0
    older = [p for p in list_checkpoints(source.parent) if (step_of(p) or 0) < step]
    return [source, *reversed(older)]


def preset_refusal(checkpoint: Path, saved: str, configured: str) -> UsageError:
    """The one refusal of a checkpoint written for another ``model.preset``."""
    return UsageError(
        f"checkpoint {checkpoint} holds model.preset={saved!r}, the config says {configured!r}",
        f"resume with --set model.preset={saved}",
    )


def check_before_launch(
    resume: str,
    ckpt_dir: str | None,
    preset: str,
    data_path: str | None = None,
    workdir: str | None = None,
    steps: int | None = None,
) -> None:
    """What the ranks would refuse on the first try, found on this machine before any rank starts
    (UsageError, exit 2): a ``data_path`` that does not exist; a ``checkpoint.dir`` that cannot be
    created or written (nothing is created here: ``--dry-run`` runs this too); a resume path that is
    missing, a file, a symlink loop or holds no published checkpoint; ``latest`` with nothing to
    resume; a checkpoint of another preset, or of other data (another vocabulary or other tokens
    than ``data_path``'s), or past ``steps`` (``train.steps``). Damage is left to the ranks: they
    verify every file and fall back. ``workdir`` is where the ranks run (relative paths are theirs)."""

    data = ranks_path(data_path, workdir) if data_path else None
    data_file(data)
    ckpt_dir = ranks_path(ckpt_dir, workdir) if ckpt_dir else None
    if ckpt_dir is not None:
        check_place(CHECKPOINT_DIR, Path(ckpt_dir), folder=True)
        check_not_in_use(Path(ckpt_dir))
    source, _ = resume_source(resume if resume in RESUME_WORDS else ranks_path(resume, workdir), ckpt_dir, tries=0)
    if source is None:
        return
    meta, _ = read_manifest(source)  # a damaged manifest: the ranks say so, and fall back
    if meta is None:
        return
    if meta.preset != preset:
        raise preset_refusal(source, meta.preset, preset)
    if meta.data is not None:
        vocab_size = model_config(preset, data).vocab_size  # first: it refuses a folder that is no dataset
        here = DataIdentity(fingerprint=data_fingerprint(data), path=data, vocab_size=vocab_size)  # as the ranks see it
        check_same_data(source, meta.data, here)
    if steps is not None:
        steps_left(source, meta.step, steps)
