"""Multi-host launch over SSH: ssh_config resolution, connections, remote commands, the SSH agent transport.

Public API (also used by ``distlaunch doctor``): ``sshconfig.resolve_targets`` / ``SshTarget``,
``ssh.connect`` / ``ssh.connect_all`` / ``ssh.SshError`` (``kind``, ``check_id``), ``command.run_command``.
"""
