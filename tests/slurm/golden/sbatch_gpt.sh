#!/bin/bash
# A Slurm batch script for distlaunch: one rank per Slurm task.
# `distlaunch slurm sbatch` fills in the placeholders in double braces and leaves out a line whose
# placeholders are all empty.
# Copy it, edit it, and render your copy with `distlaunch slurm sbatch --template my-sbatch.sh ...`,
# or fill it in by hand and submit it with plain sbatch.
#SBATCH --job-name=gpt
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=2:00:00
#SBATCH --partition=gpu
#SBATCH --account=proj42
#SBATCH --output=logs/%x-%j.out
#SBATCH --export=ALL,NCCL_DEBUG
# Slurm sends SIGUSR1 to distlaunch slurm run LEAD seconds before the time limit: every rank saves a checkpoint, then the job requeues itself (exit 75) and resumes there
# LEAD: ceil(120 s to save (not the bundled engine: a default) + 60 s Slurm's signal resolution) = 180 s
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

# `distlaunch slurm run` reads nodes, tasks, GPUs and CPUs per node from the #SBATCH lines above (through
# SLURM_JOB_NUM_NODES, SLURM_NTASKS_PER_NODE, SLURM_GPUS_PER_NODE, SLURM_CPUS_PER_TASK) and runs
#   srun --kill-on-bad-exit=1 --label ... python -m distlaunch run --launcher slurm ... SCRIPT ARGS
# Every task maps its SLURM_* variables to MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE ... and
# execs the script. One failing rank stops the step; the job exits with that rank's exit code.
# --env values are not written here: sbatch takes them from the environment distlaunch submits with.
exec /opt/venv/bin/python -m distlaunch slurm run --requeue --parallel dp=auto,tp=2,pp=2 -- train.py --config 'my cfg.toml'
