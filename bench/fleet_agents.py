"""The emulated agents of bench/agent_fleet.py: docs/agent-protocol.md over asyncio, one client each."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import defaultdict
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.lean_http import LeanClient, LeanHTTPError
from bench.live_common import logger

GPUS_PER_SERVER, CPUS_PER_SERVER, MEM_GB_PER_SERVER = 8, 24, 500.0
ITERS_PER_S = 10.0  # the emulated jobs' speed
REQUEST_TIMEOUT_S = 60.0
JITTER = 0.1
FLUSH_S, FLUSH_RETRY_S = 60.0, 0.5


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Lease:
    lease_id: str
    total_iters: int
    done_iters: float
    since: float
    seq: int = 0
    next_progress_at: float = 0.0  # wall time; as the agent, at most one progress report per interval


@dataclass
class FleetStats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sent: set[tuple[str, int]] = field(default_factory=set)
    acked: set[tuple[str, int]] = field(default_factory=set)
    starts_received: dict[str, float] = field(default_factory=dict)  # lease id -> wall time received
    wakes: int = 0
    measured: tuple[float, float] = (0.0, 0.0)  # wall-clock window of the measurement
    unsent: int = 0  # reports still unacknowledged after the final flush
    sync_times: list[tuple[float, float]] = field(default_factory=list)  # (wall time sent, seconds taken)


class FleetAgent:
    """One node agent speaking docs/agent-protocol.md: register, sync, wait."""

    def __init__(self, index: int, token: str, base_url: str, interval_s: float, stats: FleetStats) -> None:
        self.name = f"fleet{index:04d}"
        self.gpu_uuids = [f"GPU-fleet-{index:04d}-{g}" for g in range(GPUS_PER_SERVER)]
        self.interval_s = interval_s
        self.stats = stats
        # Two connections, as the agent holds: the long-poll's and the syncs'.
        self.client = LeanClient(
            base_url,
            headers={"authorization": f"Bearer {token}"},
            timeout_s=REQUEST_TIMEOUT_S,
            max_connections=2,
        )
        self.leases: dict[str, Lease] = {}
        self.pending: list[dict] = []  # reports not yet acknowledged, oldest first
        self.wake = asyncio.Event()
        self.offer: dict | None = None
        self.new_offer = asyncio.Event()
        self.measuring = False

    async def _call(self, kind: str, method: str, path: str, **kwargs) -> dict | None:
        start = time.perf_counter()
        sent_at = time.time()
        try:
            response = await self.client.request(method, path, **kwargs)
        except LeanHTTPError as exc:
            if self.measuring:
                self.stats.errors[kind] += 1
            logger.debug("%s %s: %s", self.name, path, exc)
            return None
        if self.measuring and kind != "wait":
            self.stats.latencies[kind].append(time.perf_counter() - start)
            if kind == "sync":
                self.stats.sync_times.append((sent_at, self.stats.latencies[kind][-1]))
        if response.status_code != 200:
            if self.measuring:
                self.stats.errors[kind] += 1
            logger.warning("%s %s: HTTP %s %s", self.name, path, response.status_code, response.text[:200])
            return None
        return response.json()

    async def register(self) -> None:
        body = {
            "agent_version": "fleet-bench",
            "hostname": self.name,
            "num_cpus": CPUS_PER_SERVER,
            "mem_gb": MEM_GB_PER_SERVER,
            "gpus": [
                {"index": i, "uuid": u, "model": "Tesla V100-SXM2-32GB", "memory_mb": 32768}
                for i, u in enumerate(self.gpu_uuids)
            ],
            "cgroup_mode": "none",
        }
        if await self._call("register", "POST", "/api/v1/agent/register", json=body) is None:
            raise RuntimeError(f"{self.name}: registration failed")

    def _report(self, lease: Lease, kind: str, data: dict, now: float) -> None:
        lease.seq += 1
        report = {"lease_id": lease.lease_id, "seq": lease.seq, "kind": kind, "at": _iso(now), "data": data}
        self.pending.append(report)
        self.stats.sent.add((lease.lease_id, lease.seq))

    def _advance(self, now: float) -> None:
        """Each running lease reports its progress at most once per interval (agent/leases.py: an extra
        sync, woken or after a start or exit, carries none; the next one says all the others would);
        one that reached its total exits 0."""
        for lease_id, lease in list(self.leases.items()):
            lease.done_iters = min(lease.total_iters, lease.done_iters + ITERS_PER_S * (now - lease.since))
            lease.since = now
            done = int(lease.done_iters)
            if done >= lease.total_iters:
                data = {"exit_code": 0, "signal": None, "oom": False, "done_iters": done}
                self._report(lease, "exited", data, now)
                del self.leases[lease_id]
                self.wake.set()  # an exit is sent at once, as the agent does
            elif now >= lease.next_progress_at:
                lease.next_progress_at = now + self.interval_s * (1 - JITTER)
                self._report(lease, "progress", {"done_iters": done, "iters_per_s": ITERS_PER_S}, now)

    def _obey(self, commands: list[dict], now: float) -> None:
        for command in commands:
            kind, lease_id = command["kind"], command.get("lease_id")
            if kind == "start" and lease_id not in self.leases:
                argv = command.get("argv") or []
                total = int(argv[argv.index("--iters") + 1]) if "--iters" in argv else 10**6
                lease = Lease(lease_id, total, float(command.get("resume_iters") or 0), now)
                self.leases[lease_id] = lease
                self.stats.starts_received.setdefault(lease_id, time.time())
                # As the agent: its `started` goes with the next sync, not one of its own.
                self._report(lease, "started", {"pid": 4242, "isolation": "bench", "cpus": []}, now)
            elif kind in ("preempt", "cancel") and lease_id in self.leases:
                lease = self.leases.pop(lease_id)
                data = {"exit_code": None, "signal": 15, "oom": False, "done_iters": int(lease.done_iters)}
                self._report(lease, "exited", data, now)
                self.wake.set()

    async def sync(self) -> None:
        now = time.time()
        self._advance(now)
        batch = self.pending[:5000]
        body = {
            "sample": {
                "sampled_at": _iso(now),
                "cpu_util_pct": 40.0,
                "mem_used_gb": 120.0,
                "gpus": [{"uuid": u, "util_pct": 95.0, "mem_used_mb": 20480} for u in self.gpu_uuids],
            },
            "running": sorted(self.leases),
            "reports": batch,
        }
        answer = await self._call("sync", "POST", "/api/v1/agent/sync", json=body)
        if answer is None:
            return  # the reports stay pending and go with the next sync
        settled = {(lease_id, seq) for lease_id, seq in answer["acked"]}
        settled |= {(r["lease_id"], r["seq"]) for r in answer["rejected"] if r.get("seq") is not None}
        if answer["rejected"]:
            self.stats.errors["rejected reports"] += len(answer["rejected"])
        self.stats.acked |= {(lease_id, seq) for lease_id, seq in answer["acked"]}
        self.pending = [r for r in self.pending if (r["lease_id"], r["seq"]) not in settled]
        self._obey(answer["commands"], time.time())
        if answer.get("wait") != self.offer:
            self.offer = answer.get("wait")
            self.new_offer.set()

    async def wait_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            offer = self.offer
            if not offer:
                await self._until(self.new_offer, 1.0)
                continue
            self.new_offer.clear()
            params = {k: offer[k] for k in ("ticket", "generation", "timeout_s")}
            answer = await self._call("wait", "GET", offer["url"], params=params)
            if answer is None:
                await asyncio.sleep(5)
            elif answer["woken"]:
                self.stats.wakes += 1
                self.wake.set()
                await self._until(self.new_offer, self.interval_s)
            else:
                offer["generation"] = max(offer["generation"], answer["generation"])

    @staticmethod
    async def _until(event: asyncio.Event, timeout_s: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)

    async def run(self, stop: asyncio.Event) -> None:
        """Sync on its own schedule (the next sync `interval` after the last one began) until `stop`."""
        waiter = asyncio.create_task(self.wait_loop(stop))
        await asyncio.sleep(random.uniform(0, self.interval_s))  # agents do not start in step
        try:
            while not stop.is_set():
                began = time.monotonic()
                self.wake.clear()
                await self.sync()
                elapsed_s = time.monotonic() - began
                wait_s = self.interval_s * random.uniform(1 - JITTER, 1 + JITTER) - elapsed_s
                if wait_s > 0:
                    stopped = asyncio.create_task(stop.wait())
                    woken = asyncio.create_task(self.wake.wait())
                    await asyncio.wait({stopped, woken}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                    for task in (stopped, woken):
                        task.cancel()
        finally:
            waiter.cancel()

    async def flush(self) -> None:
        """Send what is still unacknowledged (the end of the run) until nothing is left, for at most
        FLUSH_S, as the agent's spool does: reports deferred while a round holds their jobs' rows (the
        service waits 100 ms for them) go with a later sync, and rounds go on while the bench ends."""
        deadline = time.monotonic() + FLUSH_S
        while self.pending and time.monotonic() < deadline:
            await self.sync()
            if self.pending:
                await asyncio.sleep(FLUSH_RETRY_S)


async def healthz_baseline(base_url: str, rate_per_s: float, seconds: float) -> tuple[list[float], int]:
    """GET /healthz open loop at `rate_per_s` for `seconds`: latencies and errors."""
    latencies: list[float] = []
    errors = 0
    # The agents' own client, so that the ratio compares the service's answers, not two clients.
    client = LeanClient(base_url, headers={}, timeout_s=REQUEST_TIMEOUT_S, max_connections=64)
    try:

        async def one() -> None:
            nonlocal errors
            start = time.perf_counter()
            try:
                response = await client.request("GET", "/healthz")
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1
            except LeanHTTPError:
                errors += 1

        tasks = []
        begin = time.monotonic()
        for i in range(int(rate_per_s * seconds)):
            await asyncio.sleep(max(0.0, begin + i / rate_per_s - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    finally:
        await client.aclose()
    return latencies, errors


async def run_fleet(tokens: list[str], base_url: str, args: argparse.Namespace) -> FleetStats:
    stats = FleetStats()
    agents = [FleetAgent(i, token, base_url, args.interval, stats) for i, token in enumerate(tokens)]
    semaphore = asyncio.Semaphore(32)

    async def register(agent: FleetAgent) -> None:
        async with semaphore:
            await agent.register()

    start = time.monotonic()
    await asyncio.gather(*(register(a) for a in agents))
    logger.info("%d agents registered in %.1f s", len(agents), time.monotonic() - start)
    stop = asyncio.Event()
    runs = [asyncio.create_task(a.run(stop)) for a in agents]
    await asyncio.sleep(args.warmup)
    for agent in agents:
        agent.measuring = True
    stats.latencies.clear()
    stats.errors.clear()
    measured_from = time.time()
    await asyncio.sleep(args.seconds)
    for agent in agents:
        agent.measuring = False
    stats.measured = (measured_from, time.time())
    stop.set()
    await asyncio.gather(*runs, return_exceptions=True)
    await asyncio.gather(*(a.flush() for a in agents))
    stats.unsent = sum(len(a.pending) for a in agents)
    await asyncio.gather(*(a.client.aclose() for a in agents))
    return stats
