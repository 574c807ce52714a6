"""A real PyTorch CPU training job whose speed depends on its cores: JPEG decoding and augmentation.

`python -m agent.torch_workload --iters 200`. Needs torch and Pillow (requirements-profiling.txt); this
module imports them only when it runs, so the agent itself never needs them. It trains a small CNN on
images it generates once into a data directory (JPEG or PNG, written with Pillow, reused by every later
run: the dataset stays cached) and reads them back through a real torch DataLoader with
`num_workers = cores granted - 1`: each worker decodes files with Pillow and augments them (random crop,
resize, horizontal flip, normalisation, written with torch and Pillow: there is no torchvision). The training
step itself runs on one thread, standing in for the GPU, so extra cores speed up the input pipeline,
which is what Synergy's CPU sensitivity is about.

It keeps the synthetic workload's contract with the agent (agent/workload.py): ATTUNE_PROGRESS_PATH
(done_iters and iters_per_s, measured after ATTUNE_WARMUP_ITERS iterations), ATTUNE_CHECKPOINT_PATH
(iteration count, plus the model's weights beside it) written every `--checkpoint-every-s` and on
SIGTERM (then exit 0), resume from max(checkpoint, ATTUNE_RESUME_ITERS), exit 137 on MemoryError.
The data directory is `--data-dir`, else ATTUNE_DATA_DIR (a profiling run shares one across its
points), else `data/` in the working directory. `--batch` sets the per-GPU batch: GENIE's profiling run
measures the iteration time at two or three of them (docs/genie.md). The progress file also carries
`param_bytes` (the model's size, for GENIE's platform model) and `startup_s` (seconds from the start of
this module to the steady state, less what the warm-up iterations take at the steady speed: the
one-off start-up cost s_0 of GENIE's execution time). `--cpu-time` times iterations in the process's
CPU seconds instead of wall seconds (with one core, so no loader worker, that is all the work): tests use
it on shared CI machines, where a neighbour's load would otherwise be measured too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

STARTED_S = time.monotonic()  # interpreter start-up itself (tens of ms) is not counted
OOM_EXIT_CODE = 137
NUM_CLASSES = 10
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def granted_cpus(environ: dict[str, str] | None = None) -> int:
    """Cores granted: ATTUNE_CPUS_GRANTED (fake-host mode), else this process's CPU affinity."""
    environ = os.environ if environ is None else environ
    if environ.get("ATTUNE_CPUS_GRANTED"):
        return max(1, int(environ["ATTUNE_CPUS_GRANTED"]))
    return max(1, len(os.sched_getaffinity(0)))


def generate_images(data_dir: Path, *, count: int, size: int, fmt: str, seed: int = 0) -> list[Path]:
    """Write `count` labelled images (noise, gradients and shapes: something worth decoding) once.

    A `.complete` marker makes the directory reusable: later runs (the next profiling point, the job
    after its profile) read the same files.
    """
    from PIL import Image, ImageDraw  # noqa: PLC0415 - optional: requirements-profiling.txt

    ext = "jpg" if fmt == "jpeg" else "png"
    marker = data_dir / f".complete-{count}-{size}-{ext}"
    files = [data_dir / f"img{i:05d}_c{i % NUM_CLASSES}.{ext}" for i in range(count)]
    if marker.exists():
        return files
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for i, path in enumerate(files):
        noise = Image.effect_noise((size, size), rng.uniform(20, 80)).convert("RGB")
        draw = ImageDraw.Draw(noise)
        for _ in range(3 + i % 4):
            x0, y0 = rng.randrange(size), rng.randrange(size)
            x1, y1 = min(size - 1, x0 + rng.randrange(4, size)), min(size - 1, y0 + rng.randrange(4, size))
            color = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
            (draw.ellipse if i % 2 else draw.rectangle)((x0, y0, x1, y1), fill=color)
        tmp = path.with_suffix(".tmp")
        noise.save(tmp, format="JPEG" if ext == "jpg" else "PNG", quality=90)
        os.replace(tmp, path)
    marker.touch()
    return files


def build(args: argparse.Namespace, files: list[Path], workers: int) -> tuple[Any, Any, Any, Any]:
    """(loader, model, optimiser, loss) on torch."""
    import torch  # noqa: PLC0415 - optional: requirements-profiling.txt
    from PIL import Image  # noqa: PLC0415 - optional: requirements-profiling.txt
    from torch import nn  # noqa: PLC0415 - optional: requirements-profiling.txt
    from torch.utils.data import DataLoader, Dataset  # noqa: PLC0415 - optional: requirements-profiling.txt

    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)

    class JpegFolder(Dataset):
        """Decode, random-crop, flip and normalise one image per item (in the loader's workers)."""

        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, index: int):
            path = files[index]
            with Image.open(path) as img:
                img = img.convert("RGB")
                w, h = img.size
                left, top = random.randint(0, w - args.crop), random.randint(0, h - args.crop)
                img = img.crop((left, top, left + args.crop, top + args.crop))
                img = img.resize((args.input_size, args.input_size), Image.Resampling.BILINEAR)
                if random.random() < 0.5:
                    img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                raw = img.tobytes()
            x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(args.input_size, args.input_size, 3)
            x = x.permute(2, 0, 1).float().div_(255).sub_(mean).div_(std)
            label = int(path.stem.rsplit("_c", 1)[1])
            return x, label

    loader = DataLoader(
        JpegFolder(),
        batch_size=args.batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
    )
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, NUM_CLASSES),
    )
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return loader, model, optimiser, nn.CrossEntropyLoss()


def _write_json(path: Path, data: dict[str, Any], *, durable: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415 - optional: requirements-profiling.txt

    env = os.environ
    torch.set_num_threads(1)  # the step stands in for the GPU; the other cores feed it
    cpus = granted_cpus()
    workers = max(0, cpus - 1)
    data_dir = Path(args.data_dir or env.get("ATTUNE_DATA_DIR") or "data")
    t_data = time.monotonic()
    files = generate_images(data_dir, count=args.num_images, size=args.image_size, fmt=args.format)
    checkpoint = Path(env["ATTUNE_CHECKPOINT_PATH"]) if env.get("ATTUNE_CHECKPOINT_PATH") else None
    progress = Path(env["ATTUNE_PROGRESS_PATH"]) if env.get("ATTUNE_PROGRESS_PATH") else None
    warmup = int(env.get("ATTUNE_WARMUP_ITERS") or 0)
    base = int(env.get("ATTUNE_RESUME_ITERS") or 0)
    loader, model, optimiser, loss_fn = build(args, files, workers)
    weights = checkpoint.with_suffix(".pt") if checkpoint is not None else None
    if checkpoint is not None and checkpoint.exists():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            base = max(base, int(json.loads(checkpoint.read_text())["done_iters"]))
        if weights is not None and weights.exists():
            model.load_state_dict(torch.load(weights))
    base = min(base, args.iters)
    print(
        f"torch workload: {cpus} core(s) -> {workers} loader worker(s), batch {args.batch}, "
        f"{len(files)} {args.format} images of {args.image_size}px in {data_dir} "
        f"(ready in {time.monotonic() - t_data:.1f} s), resuming at {base}",
        flush=True,
    )

    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))

    done = base
    timed_from: tuple[float, int] | None = None  # (time, iteration) where timing starts

    cpu_from: list[float] = []  # process CPU time where timing starts (--cpu-time)

    def rate(now: float) -> float:
        if timed_from is None or done <= timed_from[1] or now <= timed_from[0]:
            return 0.0
        if args.cpu_time and cpu_from:
            spent = time.process_time() - cpu_from[0]
            return (done - timed_from[1]) / spent if spent > 0 else 0.0
        return (done - timed_from[1]) / (now - timed_from[0])

    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def startup_s(now: float) -> float | None:
        speed = rate(now)
        if timed_from is None or speed <= 0:
            return None
        return max(0.0, timed_from[0] - STARTED_S - (timed_from[1] - base) / speed)

    def save(now: float, *, durable: bool) -> None:
        if progress is not None:
            data = {
                "done_iters": done,
                "iters_per_s": rate(now),
                "total_iters": args.iters,
                "param_bytes": param_bytes,
                "startup_s": startup_s(now),
            }
            _write_json(progress, data, durable=False)
        if durable and checkpoint is not None:
            if weights is not None:
                torch.save(model.state_dict(), weights)
            _write_json(checkpoint, {"done_iters": done}, durable=True)

    if done - base >= warmup:
        timed_from = (time.monotonic(), done)
        cpu_from.append(time.process_time())
    next_progress = next_checkpoint = time.monotonic()
    batches = iter(loader)
    while done < args.iters and not stop:
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)  # a new epoch
            continue
        optimiser.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimiser.step()
        done += 1
        now = time.monotonic()
        if timed_from is None and done - base >= warmup:
            timed_from = (now, done)  # warm-up over: worker start-up and first batches left out
            cpu_from.append(time.process_time())
        if done % args.log_every == 0:
            print(f"iteration {done}/{args.iters} loss {loss.item():.3f} {rate(now):.2f} it/s", flush=True)
        if now >= next_checkpoint:
            save(now, durable=True)
            next_checkpoint = now + args.checkpoint_every_s
        elif now >= next_progress:
            save(now, durable=False)
            next_progress = now + args.progress_every_s
    now = time.monotonic()
    save(now, durable=True)
    if stop:
        name = signal.Signals(stop[0]).name
        print(f"{name} received: checkpointed at iteration {done}/{args.iters}, exiting", flush=True)
    else:
        print(f"done: {done - base} iterations, {rate(now):.3f} it/s after warm-up", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agent.torch_workload", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=256, help="generated images are this square")
    parser.add_argument("--crop", type=int, default=224, help="random crop size")
    parser.add_argument("--input-size", type=int, default=64, help="model input (crop resized)")
    parser.add_argument("--num-images", type=int, default=256)
    parser.add_argument("--format", choices=["jpeg", "png"], default="jpeg")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time iterations in this process's CPU seconds, not wall seconds: only meaningful without "
        "loader workers (1 core), for tests on shared machines where wall time measures the neighbours",
    )
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--progress-every-s", type=float, default=0.5)
    parser.add_argument("--checkpoint-every-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.iters <= 0 or args.crop > args.image_size:
        parser.error("--iters must be positive and --crop at most --image-size")
    try:
        import PIL  # noqa: F401, PLC0415 - optional: requirements-profiling.txt
        import torch  # noqa: F401, PLC0415 - optional: requirements-profiling.txt
    except ImportError as exc:
        print(f"error: needs torch and Pillow (requirements-profiling.txt): {exc}", flush=True)
        return 2
    try:
        return run(args)
    except MemoryError:
        print("MemoryError: the workload ran out of memory", file=sys.stderr, flush=True)
        return OOM_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
