"""``distlaunch k8s submit``: the manifest piped to ``kubectl apply -f -``."""

from __future__ import annotations

import subprocess

from distlaunch.k8s.kubectl import kubectl_path

APPLY = ["apply", "-f", "-"]


def kubectl_apply(text: str) -> int:
    """Apply a YAML stream with the kubectl on PATH (its output passes through); returns kubectl's exit code."""
    return subprocess.run([kubectl_path(APPLY), *APPLY], input=text, text=True, check=False).returncode
