#!/bin/bash
# A Slurm batch script for distlaunch: one rank per Slurm task.
# `distlaunch slurm sbatch` fills in the placeholders in double braces and leaves out a line whose
# placeholders are all empty.
# Copy it, edit it, and render your copy with `distlaunch slurm sbatch --template my-sbatch.sh ...`,
# or fill it in by hand and submit it with plain sbatch.
#SBATCH --job-name={{job_name}}
#SBATCH --nodes={{nodes}}
#SBATCH --ntasks-per-node={{ntasks_per_node}}
#SBATCH --gpus-per-node={{gpus_per_node}}
#SBATCH --cpus-per-task={{cpus_per_task}}
#SBATCH --time={{time}}
#SBATCH --partition={{partition}}
#SBATCH --account={{account}}
#SBATCH --output={{output}}
#SBATCH --export={{export}}
# {{requeue_note}}
# LEAD: {{lead_how}}
#SBATCH --signal={{signal}}
#SBATCH {{requeue}}
#SBATCH --open-mode={{open_mode}}
set -euo pipefail

# `distlaunch slurm run` reads nodes, tasks, GPUs and CPUs per node from the #SBATCH lines above (through
# SLURM_JOB_NUM_NODES, SLURM_NTASKS_PER_NODE, SLURM_GPUS_PER_NODE, SLURM_CPUS_PER_TASK) and runs
#   srun --kill-on-bad-exit=1 --label ... python -m distlaunch run --launcher slurm ... SCRIPT ARGS
# Every task maps its SLURM_* variables to MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE ... and
# execs the script. One failing rank stops the step; the job exits with that rank's exit code.
# --env values are not written here: sbatch takes them from the environment distlaunch submits with.
exec {{distlaunch}} slurm run {{launch_options}} -- {{program}}
