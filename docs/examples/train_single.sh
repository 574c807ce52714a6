#!/bin/bash
# One GPU, one process, checkpointing to the node-local private directory (Attune example).
# Submit from the directory that holds train_ddp.py:  cd docs/examples && python -m cli submit train_single.sh
#SBATCH --job-name=single-example
#SBATCH --gpus=1
#SBATCH --time=20:00
#ATTUNE --iters 100
set -euo pipefail
# $ATTUNE_CHECKPOINT_DIR is on this server and readable by your account alone; a job that may resume
# on another server should checkpoint to a shared filesystem instead (see ddp_multinode.sh).
exec python3 train_ddp.py --steps 100 --step-s 0.3 --checkpoint-dir "$ATTUNE_CHECKPOINT_DIR"
