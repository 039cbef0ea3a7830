"""Running a plan: the launch (job record, preflight, the master port's lock), one attempt's event loop over
its agents, the agent transport on this machine, detached supervisors, rank logs, and signals."""
