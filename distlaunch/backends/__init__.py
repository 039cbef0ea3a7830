"""Where and how a job runs: one class per way of running it, each owning the job's whole lifecycle.

A backend plans what it would start (what ``--dry-run`` prints), starts it in the foreground or submits it
detached, and answers for the job afterwards: its state, its output, a stop, its ranks' stacks. The commands
pick a backend from the registry (``registry.select`` for ``run``/``train``, ``registry.of_record`` for a
recorded job) and hold no backend code of their own.

- ``hosts.Hosts``: this machine and SSH hosts from a hostfile, one agent per host (distlaunch/launcher, remote).
- ``node.Node``: this node's part of a job started once per node (--nnodes, torchrun's multi-node form).
- ``srun_step.SrunStep``: inside an srun step, this task becomes one rank and execs the program.
- ``slurm_batch.SlurmBatch``: a batch job submitted with ``distlaunch slurm sbatch``; Slurm runs it.
- ``kubernetes.Kubernetes``: an Indexed Job submitted with ``distlaunch k8s submit``; the cluster runs it.

Adding a backend (PBS, LSF, ...) is one module here and one line in ``registry.BACKENDS``: see
docs/architecture.md.
"""
