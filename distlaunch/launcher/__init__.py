"""The launcher: hostfile and parallel spec → pure launch plan → execution. Never imports torch at module level."""
