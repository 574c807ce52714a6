"""GPU and host backends: fake GPUs, NVML through a stubbed pynvml module, psutil with a pretend inventory."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from agent.gpus import FakeGpuBackend, GpuBackendError, NvmlGpuBackend, select_gpu_backend
from agent.host import PsutilHostBackend


def test_fake_gpu_uuids_are_stable_per_agent_name():
    a1, a2, b = FakeGpuBackend(3, "node-a"), FakeGpuBackend(3, "node-a"), FakeGpuBackend(3, "node-b")
    assert [g.uuid for g in a1.inventory()] == [g.uuid for g in a2.inventory()]
    assert not {g.uuid for g in a1.inventory()} & {g.uuid for g in b.inventory()}
    assert len({g.uuid for g in a1.inventory()}) == 3
    assert [g.index for g in a1.inventory()] == [0, 1, 2]


def test_fake_gpu_utilisation_follows_the_leases():
    backend = FakeGpuBackend(2, "node-a")
    busy = backend.inventory()[1].uuid
    for _ in range(5):
        idle_sample, busy_sample = backend.sample({busy})
        assert idle_sample.util_pct == 0.0 and idle_sample.mem_used_mb == 0.0
        assert 88.0 <= busy_sample.util_pct <= 99.0 and busy_sample.mem_used_mb > 0


def fake_pynvml(*, init_error: Exception | None = None, uuid_type=str) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    state = {"shutdown": False}

    class NVMLError(Exception):
        pass

    def nvml_init():
        if init_error is not None:
            raise init_error

    handles = ["h0", "h1"]
    module.NVMLError = NVMLError
    module.nvmlInit = nvml_init
    module.nvmlShutdown = lambda: state.update(shutdown=True)
    module.nvmlDeviceGetCount = lambda: len(handles)
    module.nvmlDeviceGetHandleByIndex = lambda i: handles[i]
    module.nvmlDeviceGetUUID = lambda h: uuid_type(
        f"GPU-{h}-uuid".encode() if uuid_type is bytes else f"GPU-{h}-uuid"
    )
    module.nvmlDeviceGetName = lambda h: (
        b"Tesla V100-SXM2-32GB" if uuid_type is bytes else "Tesla V100-SXM2-32GB"
    )
    module.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(
        total=32 * 1024**3, used=(2 if h == "h0" else 0) * 1024**3
    )
    module.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=97 if h == "h0" else 0, memory=40)
    module.state = state
    return module


@pytest.mark.parametrize("uuid_type", [str, bytes])  # nvidia-ml-py returned bytes in older releases
def test_nvml_backend_reads_inventory_and_usage(monkeypatch, uuid_type):
    stub = fake_pynvml(uuid_type=uuid_type)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    backend = NvmlGpuBackend()
    inventory = backend.inventory()
    assert [(g.index, g.uuid, g.model, g.memory_mb) for g in inventory] == [
        (0, "GPU-h0-uuid", "Tesla V100-SXM2-32GB", 32768),
        (1, "GPU-h1-uuid", "Tesla V100-SXM2-32GB", 32768),
    ]
    samples = backend.sample(busy_uuids=())
    assert [(s.uuid, s.util_pct, s.mem_used_mb) for s in samples] == [
        ("GPU-h0-uuid", 97.0, 2048.0),
        ("GPU-h1-uuid", 0.0, 0.0),
    ]
    backend.close()
    assert stub.state["shutdown"]


def test_nvml_errors_are_clean(monkeypatch):
    stub = fake_pynvml()
    stub_error = stub.NVMLError("NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=stub_error))
    with pytest.raises(GpuBackendError, match=r"NVML is unavailable.*Shared Library Not Found"):
        NvmlGpuBackend()
    with pytest.raises(GpuBackendError, match="--fake-gpus N"):
        select_gpu_backend(fake_gpus=None, agent_name="x")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the package is not installed
    with pytest.raises(GpuBackendError, match="nvidia-ml-py package is not installed"):
        NvmlGpuBackend()


def test_selection_prefers_fake_gpus_when_asked(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    assert select_gpu_backend(fake_gpus=None, agent_name="x").name == "nvml"
    assert select_gpu_backend(fake_gpus=2, agent_name="x").name == "fake"
    with pytest.raises(GpuBackendError):
        FakeGpuBackend(0, "x")


def test_psutil_host_reports_pretend_inventory_and_real_usage():
    backend = PsutilHostBackend(report_cpus=24, report_mem_gb=500)
    assert (backend.inventory().num_cpus, backend.inventory().mem_gb) == (24, 500.0)
    sample = backend.sample()
    assert 0.0 <= sample.cpu_util_pct <= 100.0 and sample.mem_used_gb > 0
    real = PsutilHostBackend()
    assert real.inventory().num_cpus >= 1 and real.inventory().mem_gb > 0
