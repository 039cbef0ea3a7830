"""Running a plan: the launch (job record, preflight, the master port's lock), one attempt's event loop over
its agents with its collaborators (its failed ranks, the stops from outside them, what it leaves for the report),
the agent transport on this machine, detached supervisors, rank logs, and signals."""
