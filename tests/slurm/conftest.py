"""The real two-node Slurm cluster (node1, node2 on this machine): ``slurm_cluster`` (session scope)."""

from fixtures.slurm import slurm_cluster  # noqa: F401
