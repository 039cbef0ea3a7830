"""Planning a launch: hostfile and options → ``LaunchSpec`` (everything impure: files, addresses, ports) → the
pure ``LaunchPlan`` every backend starts, checks included. Nothing here starts a process."""
