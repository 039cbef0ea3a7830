"""Multi-host launch over SSH: ssh_config resolution, connections, remote commands, the agents' transports.

Public API (also used by ``distlaunch doctor``): ``sshconfig.resolve_targets`` / ``SshTarget``,
``ssh.connect`` / ``ssh.connect_all`` / ``ssh.SshError`` (``kind``, ``check_id``), ``command.run_command``.
A launch opens its ``session.RemoteHosts`` with ``preflight.preflight``: by default an OpenSSH client per host
(``fanout``, ``sshproc``, ``openssh``) read by one thread (``pipes``); paramiko from inside the launcher where no
``ssh`` is installed (``session.ParamikoHosts``, ``agent_conn``).
"""
