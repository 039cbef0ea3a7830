"""The launcher: from options to ranks running everywhere, and what keeps them honest. Never imports torch.

- ``planning``: the hostfile, the resolved options (``LaunchSpec``) and the pure, serialisable ``LaunchPlan``;
  what every rank runs and what can be checked before it starts; ``train``'s plan.
- ``running``: a plan's execution: the launch (records, preflight, port lock), the attempt's event loop, the
  agents' transport here, detached supervisors, the job's journal, rank logs and signals.
- ``supervising``: the watches an attempt's loop consults (output, heartbeats, hangs, stacks, saves,
  stragglers, goodput, the live view) and the requests commands leave for a running job.
- ``elastic``: jobs that outlive a host (spares, shrinking) and per-node jobs that meet at a rendezvous.
"""
