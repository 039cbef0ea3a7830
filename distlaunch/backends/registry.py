"""The backends by name: the one place that knows them all."""

from __future__ import annotations

import logging

from distlaunch.backends import srun_step
from distlaunch.backends.base import Backend, LaunchRequest
from distlaunch.backends.hosts import Hosts
from distlaunch.backends.kubernetes import Kubernetes
from distlaunch.backends.node import Node
from distlaunch.backends.slurm_batch import SlurmBatch
from distlaunch.backends.srun_step import SrunStep
from distlaunch.jobs.store import JobRecord

log = logging.getLogger("distlaunch")

# A new backend is one module beside these and one line here.
BACKENDS: dict[str, type[Backend]] = {
    "hosts": Hosts,
    "node": Node,
    "srun-step": SrunStep,
    "slurm": SlurmBatch,
    "k8s": Kubernetes,
}


def named(name: str) -> Backend:
    """The backend of this name (``slurm``, ``k8s``): the one a submitting command hands its job to."""
    return BACKENDS[name]()


def of_record(record: JobRecord) -> Backend:
    """The backend that answers for a recorded job (a record of an unknown kind: as a launcher's)."""
    return next((cls() for cls in BACKENDS.values() if record.backend in cls.records), Hosts())


def select(request: LaunchRequest, detach: bool = False) -> Backend:
    """The backend that starts ``run``/``train``'s request, its options checked."""
    if srun_step.wanted(request.launcher):
        backend: Backend = SrunStep()
    elif request.node is not None:
        backend = Node()
    else:
        backend = Hosts()
    backend.check(request, detach)
    log.debug(f"backend: {backend.name}")
    return backend
