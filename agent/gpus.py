"""GPU backends: NVML (through nvidia-ml-py) on real nodes, synthetic GPUs for machines without one."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import threading
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

MIB = 1024 * 1024
# Fixed namespace so that a fake agent's GPU UUIDs are the same on every run (the service keys GPUs by UUID).
FAKE_GPU_NAMESPACE = uuid.UUID("5f0c2a5e-2d0b-4c55-9a53-6c1d4a7e0b01")


class GpuBackendError(RuntimeError):
    """The GPU backend cannot be used (no driver, no library, no device)."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as registered: `uuid` is what CUDA_VISIBLE_DEVICES names."""

    index: int
    uuid: str
    model: str
    memory_mb: int

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "model": self.model, "memory_mb": self.memory_mb}


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's usage at one moment: utilisation in percent, memory used in MiB."""

    uuid: str
    util_pct: float
    mem_used_mb: float

    def as_json(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "util_pct": self.util_pct, "mem_used_mb": self.mem_used_mb}


class GpuBackend(Protocol):
    """Inventory and usage of the node's GPUs.

    `inventory()` is fixed for the agent's lifetime (ordered by index). `sample(busy_uuids)` reads the
    current usage of every GPU; `busy_uuids` are the GPUs the agent's leases hold, which real backends
    ignore (they measure) and the fake one uses to synthesise a plausible load.
    """

    name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self, busy_uuids: Collection[str]) -> list[GpuSample]: ...

    def close(self) -> None: ...


class FakeGpuBackend:
    """N synthetic GPUs with stable UUIDs derived from the agent name; busy GPUs look ~90% utilised."""

    name = "fake"

    def __init__(
        self, count: int, agent_name: str, *, model: str = "Fake V100-SXM2-32GB", memory_mb: int = 32768
    ) -> None:
        if count <= 0:
            raise GpuBackendError(f"--fake-gpus must be positive, not {count}")
        self._gpus = [
            GpuInfo(i, f"GPU-{uuid.uuid5(FAKE_GPU_NAMESPACE, f'{agent_name}/{i}')}", model, memory_mb)
            for i in range(count)
        ]
        self._tick = 0
        self._lock = threading.Lock()

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self, busy_uuids: Collection[str]) -> list[GpuSample]:
        with self._lock:
            self._tick += 1
            tick = self._tick
        samples = []
        for gpu in self._gpus:
            if gpu.uuid in busy_uuids:
                # Deterministic jitter in 88..99% so charts look alive without a random generator.
                jitter = hashlib.sha256(f"{gpu.uuid}/{tick}".encode()).digest()[0] % 12
                samples.append(GpuSample(gpu.uuid, 88.0 + jitter, round(gpu.memory_mb * 0.7)))
            else:
                samples.append(GpuSample(gpu.uuid, 0.0, 0.0))
        return samples

    def close(self) -> None:
        pass


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returned bytes before 11.515 and str since; accept both.
    return value.decode() if isinstance(value, bytes) else value


class NvmlGpuBackend:
    """Real GPUs through NVML (the `pynvml` module of nvidia-ml-py)."""

    name = "nvml"

    def __init__(self) -> None:
        try:
            self._nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            raise GpuBackendError("NVML is unavailable: the nvidia-ml-py package is not installed") from exc
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            raise GpuBackendError(f"NVML is unavailable (no NVIDIA driver?): {exc}") from exc
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._gpus = []
            for index, handle in enumerate(self._handles):
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                self._gpus.append(
                    GpuInfo(
                        index=index,
                        uuid=_text(self._nvml.nvmlDeviceGetUUID(handle)),
                        model=_text(self._nvml.nvmlDeviceGetName(handle)),
                        memory_mb=int(memory.total // MIB),
                    )
                )
        except Exception as exc:
            self.close()
            raise GpuBackendError(f"NVML could not list the GPUs: {exc}") from exc

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self, busy_uuids: Collection[str]) -> list[GpuSample]:
        samples = []
        for gpu, handle in zip(self._gpus, self._handles, strict=True):
            try:
                util = float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                used_mb = float(self._nvml.nvmlDeviceGetMemoryInfo(handle).used // MIB)
            except Exception as exc:  # a GPU that fell off the bus must not stop the heartbeat
                raise GpuBackendError(f"NVML could not read {gpu.uuid}: {exc}") from exc
            samples.append(GpuSample(gpu.uuid, util, used_mb))
        return samples

    def close(self) -> None:
        with contextlib.suppress(Exception):  # shutting down: nothing useful to do with an error
            self._nvml.nvmlShutdown()


def select_gpu_backend(*, fake_gpus: int | None, agent_name: str) -> GpuBackend:
    """The fake backend when `fake_gpus` is given, else NVML; a clear error when neither is possible."""
    if fake_gpus is not None:
        return FakeGpuBackend(fake_gpus, agent_name)
    try:
        backend = NvmlGpuBackend()
    except GpuBackendError as exc:
        raise GpuBackendError(f"{exc}. To run without GPUs, pass --fake-gpus N for synthetic GPUs.") from exc
    if not backend.inventory():
        backend.close()
        raise GpuBackendError("NVML found no GPU on this node. To run without GPUs, pass --fake-gpus N.")
    return backend
