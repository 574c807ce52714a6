"""A minimal PyTorch DistributedDataParallel training loop that checkpoints and resumes (Attune example).

Started by torchrun (see ddp_multinode.sh) or alone as one process (train_single.sh). It trains a tiny
model on synthetic data, all-reduces gradients over gloo (CPU) or NCCL (GPU), and:
- saves a checkpoint every --checkpoint-every steps and when it receives SIGTERM (Attune's preemption
  notice: SIGKILL follows after the grace period), atomically, from rank 0 only;
- resumes from the newest checkpoint when it starts again (after a preemption or a node failure);
- writes its progress to $ATTUNE_PROGRESS_PATH so that the job page shows it.
On several servers keep --checkpoint-dir on a shared filesystem (the job's working directory usually
is): rank 0 may start on another server when the job resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

stop_requested = False


def on_sigterm(_signum, _frame) -> None:
    # Only a flag: the loop saves at a step boundary, where the model is consistent on every rank.
    global stop_requested
    stop_requested = True


def save_checkpoint(path: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write leaves the previous checkpoint intact


def write_progress(step: int, iters_per_s: float) -> None:
    target = os.environ.get("ATTUNE_PROGRESS_PATH")
    if not target:
        return
    tmp = f"{target}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"done_iters": step, "iters_per_s": iters_per_s}, fh)
    os.replace(tmp, target)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-s", type=float, default=0.0, help="extra seconds per step (for demos)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("ATTUNE_CHECKPOINT_DIR", "checkpoints"))
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)

    distributed = "RANK" in os.environ  # set by torchrun
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt_dir = Path(args.checkpoint_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / "last.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights to all
    print(f"rank {rank}/{world} on {os.uname().nodename}: starting at step {start}", flush=True)

    t0, step = time.monotonic(), start
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        if args.step_s:
            time.sleep(args.step_s)
        stop = stop_requested
        if distributed:
            # Every rank stops at the same step: each server's part gets its SIGTERM when its own agent
            # acts, up to a sync apart, and a rank that left alone would break rank 0's next all-reduce
            # before rank 0 saved (it then restarted from an older checkpoint).
            flag = torch.tensor([1.0 if stop_requested else 0.0], device=next(model.parameters()).device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        if rank == 0:
            write_progress(step, (step - start) / max(1e-9, time.monotonic() - t0))
            if step % args.checkpoint_every == 0 or stop:
                save_checkpoint(ckpt, step, model.module if distributed else model, optimizer)
        if stop:
            print(f"rank {rank}: SIGTERM at step {step}, checkpoint saved, exiting", flush=True)
            return 0
    if rank == 0:
        if step > start:  # else it had finished before it was stopped: nothing new to save
            save_checkpoint(ckpt, step, model.module if distributed else model, optimizer)
        print(f"done: {args.steps} steps", flush=True)
    if distributed:
        # Leave together, then without tearing the process group down: a rank whose teardown overlapped
        # a peer's exit aborted in gloo ("terminate called without an active exception", exit -6), even
        # after a barrier, and the job failed after all its steps were done. The checkpoint is saved
        # and the output flushed; os._exit skips the C++ destructors that abort.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
