"""What the training loop calls: resume before the first step, guard each step, save when due.

Which checkpoint to resume from is decided on rank 0 (``resume``: the rules of ``checkpoint.resume``)
and broadcast, so every rank loads the same one. Each candidate is verified by all ranks together,
then loaded; a damaged one, found by either step, falls back to the next older one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

import distlaunch
from distlaunch import saverequest
from distlaunch.engine.fault import FaultPlan
from distlaunch.engine.watchdog import Watchdog
from distlaunch.errors import DistlaunchError
from distlaunch.training.checkpoint.integrity import DamagedCheckpoint, verify_share
from distlaunch.training.checkpoint.manifest import CheckpointMeta
from distlaunch.training.faults import restart_count
from distlaunch.training.resume import nothing_left, resume_candidates, resume_source, steps_left


class Checkpointing:
    """Checkpoint, fault and watchdog hooks of one rank's training loop."""

    def __init__(self, engine, rank: int, environ: dict[str, str] | None = None):
        self.engine, self.rank = engine, rank
        self.cfg = engine.cfg
        self.tries = restart_count(environ)
        env = os.environ if environ is None else environ
        self.job = env.get("DISTLAUNCH_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or ""
        self.fault = FaultPlan.for_rank(
            self.cfg.fault, rank, engine.dims.world_size, self.tries, self.cfg.train.step_timeout
        )
        self.watchdog = Watchdog(rank)
        self.tag = f"{self.job or 'job'}-r{self.tries}"  # start() replaces it with one all ranks agree on
        self.asks_group = None  # where ranks agree on a save request: the default group, or gloo beside NCCL
        self.declined: int | None = None  # the request rank 0 said it cannot honour (no checkpoint.dir)
        self.save_s: float | None = None  # how long the newest save took, as this rank measured it

    def _agree(self) -> tuple[list[Path], str]:
        """Rank 0 picks the resume candidates and the save tag; every rank gets them (or its error)."""
        decision: list = [[], None, None]
        if self.rank == 0:
            try:
                resume = self.cfg.checkpoint.resume
                source, pointer_warning = resume_source(resume, self.cfg.checkpoint.dir, self.tries)
                if pointer_warning:
                    print(f"warning: {pointer_warning}", file=sys.stderr, flush=True)
                decision[0] = [str(p) for p in resume_candidates(source, resume, self.tries)]
            except DistlaunchError as err:
                decision[1] = err
            decision[2] = f"{self.job or uuid.uuid4().hex[:8]}-r{self.tries}"
        dist.broadcast_object_list(decision, src=0)
        if decision[1] is not None:
            raise decision[1]
        return [Path(p) for p in decision[0]], decision[2]

    def _problems(self, path: Path) -> list[str]:
        """Every rank verifies its share of ``path``'s files (collective); all ranks get every problem.
        Once every checksum matches, rank 0 reads the index (with an allow-list) and checks the byte
        ranges it reads are all there, which is what catches damage a manifest without checksums misses."""
        from distlaunch.engine.checkpoint.safe import index_problems

        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, verify_share(path, self.rank, dist.get_world_size()))
        problems = [p for part in gathered for p in part]
        if problems:
            return problems
        found = [index_problems(path) if self.rank == 0 else None]
        dist.broadcast_object_list(found, src=0)
        return found[0]

    def _resume(self, candidates: list[Path]) -> tuple[Path, CheckpointMeta]:
        """Load the first candidate that verifies and loads; each damaged one is one line on rank 0.

        A load fails on every rank together (DCP gathers the failures), so all ranks fall back alike.
        A refusal that is not damage (another preset, other data) stops the job (UsageError, exit 2).
        """
        from distlaunch.engine.checkpoint.store import load_checkpoint  # DCP costs ~1 s to import: only when used

        timeout = self.cfg.checkpoint.timeout
        for i, path in enumerate(candidates):
            with self.watchdog.guard(f"verifying checkpoint {path}", timeout, "checkpoint.timeout"):
                problems = self._problems(path)
            if not problems:
                try:
                    with self.watchdog.guard(f"loading checkpoint {path}", timeout, "checkpoint.timeout"):
                        return path, load_checkpoint(self.engine, self.engine.train_state, path)
                except DamagedCheckpoint as err:
                    problems = [err.message.removeprefix(f"cannot load {path}: ")]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            then = f"falling back to {candidates[i + 1].name}" if i + 1 < len(candidates) else "no older checkpoint"
            if self.rank == 0:
                print(
                    f"warning: checkpoint {path} is damaged: {problems[0]}{more}; {then}", file=sys.stderr, flush=True
                )
        raise DamagedCheckpoint(
            f"no intact checkpoint to resume from (tried {', '.join(str(p) for p in candidates)})",
            "restore the checkpoint files, or start fresh in a new checkpoint.dir",
        )

    def start(self) -> int:
        """Agree on the resume source and the save tag (collective), verify, load; returns the first step:
        ``train.steps + 1`` when the checkpoint already reaches the last step (nothing left to train)."""
        candidates, self.tag = self._agree()
        distlaunch.checkpoint_requested()  # arms the save signal now: it may come before the first step ends
        saverequest.save_on_sigterm()  # under srun: a SIGTERM sent straight to the ranks saves too (the loop stops)
        if dist.get_backend() != "gloo":  # on the host, beside NCCL: the flag must not wait for the device's queue
            self.asks_group = dist.new_group(backend="gloo")
        if not candidates:
            return 1
        path, meta = self._resume(candidates)
        more = steps_left(path, meta.step, self.cfg.train.steps)  # every rank loaded the same: all agree
        if self.rank == 0:
            saved = meta.layout
            print(
                f"resumed from {path} (step {meta.step}, written by dp={saved.dp},tp={saved.tp},pp={saved.pp},"
                f"zero={saved.zero}); continuing at step {meta.step + 1}"
                if more
                else nothing_left(path, meta.step, self.cfg.train.steps),
                flush=True,
            )
        return meta.step + 1

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Run one training step under the step timeout (and the fault, if it is due)."""
        with self.watchdog.guard(f"step {step}", self.cfg.train.step_timeout, "train.step_timeout"):
            self.fault.at_step(step, self.rank)
            yield

    def due(self, step: int) -> bool:
        """Whether ``step`` ends with a save: every ``checkpoint.every`` steps and the last one."""
        ckpt = self.cfg.checkpoint
        return ckpt.dir is not None and ((ckpt.every > 0 and step % ckpt.every == 0) or step == self.cfg.train.steps)

    def asked(self, step: int) -> distlaunch.SaveRequest | None:
        """The save request the ranks agree to answer after ``step``, or None (collective, every step).

        Each rank reads its own requests (a file its agent replaces, or a signal), so one may see a request a
        step before another: all ranks take the strongest that any of them saw (0 none, 1 save, 2 save and
        stop) and save the same step. Without ``checkpoint.dir`` there is nowhere to save: rank 0 says so once,
        and the launcher that asked stops the job at its deadline as it would have without asking."""
        mine = distlaunch.save_request()
        code = torch.tensor([0 if mine is None else 2 if mine.then == "stop" else 1], dtype=torch.int32)
        what = f"agreeing on a save request after step {step}"
        with self.watchdog.guard(what, self.cfg.train.step_timeout, "train.step_timeout"):
            dist.all_reduce(code, op=dist.ReduceOp.MAX, group=self.asks_group)
        if not code.item():
            return None
        then = "stop" if code.item() == 2 else "continue"
        mine = mine or distlaunch.save_request()  # another rank saw it first: by now this one's file says who asked
        why = mine.why if mine is not None else "a request seen by another rank"
        if self.cfg.checkpoint.dir is None:
            key = mine.id if mine is not None else -2
            if self.rank == 0 and self.declined != key:
                self.declined = key
                print(
                    f"warning: a checkpoint was asked for ({why}) but checkpoint.dir is not set: nothing is saved "
                    "(set checkpoint.dir to keep the work)",
                    file=sys.stderr,
                    flush=True,
                )
            return None
        return distlaunch.SaveRequest(mine.id if mine is not None else -2, then, why)

    def after_step(self, step: int, asked: bool = False) -> Path | None:
        """Save the checkpoint of ``step`` when due, or ``asked`` (collective); rank 0 gets the published path."""
        if not (self.due(step) or asked):
            return None
        from distlaunch.engine.checkpoint.store import save_checkpoint  # DCP costs ~1 s to import: only when used

        ckpt = self.cfg.checkpoint
        started = time.monotonic()
        with self.watchdog.guard(f"checkpoint save of step {step}", ckpt.timeout, "checkpoint.timeout"):
            path = save_checkpoint(
                self.engine,
                self.engine.train_state,
                step,
                Path(ckpt.dir).expanduser(),
                ckpt.keep,
                self.tag,
                lambda: self.fault.in_save(step, self.rank),
            )
        self.save_s = time.monotonic() - started
        return path
