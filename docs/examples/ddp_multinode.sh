#!/bin/bash
# Data-parallel training on 2 servers x 2 GPUs with torchrun (Attune example; docs/cli.md).
# Submit from the directory that holds train_ddp.py (its working directory; or give --chdir):
#   cd docs/examples && python -m cli submit ddp_multinode.sh
#SBATCH --job-name=ddp-example
#SBATCH --nodes=2
#SBATCH --gpus=4
#SBATCH --time=30:00
#SBATCH --output=%x-%j.%n.out
#ATTUNE --iters 100
#
# This script runs once on each server. Attune sets torchrun's rendezvous variables in every part:
# MASTER_ADDR/MASTER_PORT (where rank 0 listens), NNODES, NODE_RANK, LOCAL_WORLD_SIZE (GPUs here).
# The checkpoint goes to the working directory, on a filesystem both servers share: after a
# preemption or a node failure the job restarts as one and rank 0 may land on the other server.
set -euo pipefail
exec torchrun \
  --nnodes="$NNODES" --node-rank="$NODE_RANK" --nproc-per-node="$LOCAL_WORLD_SIZE" \
  --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \
  train_ddp.py --steps 100 --step-s 0.3 --checkpoint-dir "$PWD/checkpoints"
