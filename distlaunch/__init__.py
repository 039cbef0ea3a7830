"""distlaunch: start distributed PyTorch jobs on one machine, many machines over SSH, or Slurm."""

__version__ = "0.1.0"
