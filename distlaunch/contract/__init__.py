"""The launch contract, torch-free and backend-free: the parallel layout (grammar, resolution, rank grid) and the
per-rank environment. Every backend (local, SSH, srun step, per-node, Kubernetes) and the engine read it
from here, so a rule is written once."""
