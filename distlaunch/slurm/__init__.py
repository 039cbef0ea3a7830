"""Slurm integration: one rank per srun task inside an allocation, an srun wrapper, and sbatch generation.

Nothing here imports torch: a task maps its SLURM_* variables and execs the script within a fraction of a second.
"""
