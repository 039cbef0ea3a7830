"""``distlaunch k8s submit``: the manifest piped to ``kubectl apply -f -``."""

from __future__ import annotations

import shutil
import subprocess

from distlaunch.errors import UsageError


def kubectl_apply(text: str) -> int:
    """Apply a YAML stream with the kubectl on PATH; returns kubectl's exit code."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise UsageError(
            "kubectl is not on PATH", "install kubectl, or apply the output of distlaunch k8s manifest yourself"
        )
    return subprocess.run([kubectl, "apply", "-f", "-"], input=text, text=True, check=False).returncode
