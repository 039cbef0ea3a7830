"""Kubernetes without an operator: an Indexed Job whose pods run distlaunch's per-node mode."""
