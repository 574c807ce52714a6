"""The simulated cluster: homogeneous servers, and the all-free snapshot that every round starts from."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_app.core.types import ClusterSnapshot, ServerView


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """`servers` identical servers, each with `gpus_per_server` GPUs, CPU cores and memory (GB).

    Defaults are the paper's simulated cluster: 16 x (8 GPUs, 24 cores, 500 GB) = 128 GPUs.
    """

    servers: int = 16
    gpus_per_server: int = 8
    cpus_per_server: int = 24
    mem_gb_per_server: float = 500.0

    def __post_init__(self) -> None:
        for name in ("servers", "gpus_per_server", "cpus_per_server"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ClusterSpec.{name} must be a positive integer, got {value!r}")
        if not self.mem_gb_per_server > 0:
            raise ValueError(
                f"ClusterSpec.mem_gb_per_server must be positive, got {self.mem_gb_per_server!r}"
            )

    @property
    def total_gpus(self) -> int:
        return self.servers * self.gpus_per_server

    @property
    def total_cpus(self) -> int:
        return self.servers * self.cpus_per_server

    @property
    def total_mem_gb(self) -> float:
        return self.servers * self.mem_gb_per_server

    def snapshot(self) -> ClusterSnapshot:
        """Every server with all of its resources free (round mode re-decides every job each round).

        Immutable, so the simulator builds it once and hands the same object to every round.
        """
        all_gpus = tuple(range(self.gpus_per_server))
        return ClusterSnapshot(
            servers=tuple(
                ServerView(
                    server_id=i,
                    name=f"sim-{i:03d}",
                    num_gpus=self.gpus_per_server,
                    num_cpus=self.cpus_per_server,
                    mem_gb=float(self.mem_gb_per_server),
                    free_gpus=all_gpus,
                    free_cpus=self.cpus_per_server,
                    free_mem_gb=float(self.mem_gb_per_server),
                )
                for i in range(self.servers)
            )
        )
