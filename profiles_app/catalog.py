"""The workload catalog shipped with Attune (Synergy's model profiles), as pure core profiles.

Framework-free on purpose: the simulator reads it without Django, and `seed_demo` loads the same
entries into the database. Source: msr-fiddle/synergy (MIT), see profiles_app/data/README.md.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from profiles_app.optimistic import DatasetSpec, NodeBandwidth
from scheduler_app.core.types import SensitivityProfile

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "synergy_model_profiles.json"
PROFILING_INPUTS_PATH = Path(__file__).resolve().parent / "data" / "profiling_inputs.json"
DEFAULT_PROFILE_SET = "models"  # servers with 3 cores per GPU, the paper's testbed

# The reference groups models into these classes to build its image/language/speech job mix.
WORKLOAD_CLASSES: dict[str, str] = {
    "alexnet": "image",
    "res18": "image",
    "res50": "image",
    "mobilenet": "image",
    "shufflenet": "image",
    "gnmt": "language",
    "lstm": "language",
    "transformer": "language",
    "bert": "language",
    "deepspeech": "speech",
    "m5": "speech",
    "vae": "other",
}


class CatalogError(ValueError):
    """The catalog file or a requested model is not usable."""


@cache
def load_catalog(
    profile_set: str = DEFAULT_PROFILE_SET, path: Path = CATALOG_PATH
) -> dict[str, SensitivityProfile]:
    """Model name -> SensitivityProfile from the 1-GPU entry of each model in `profile_set`."""
    data = json.loads(path.read_text())
    cpu_grid = tuple(float(c) for c in data["cpu_per_gpu_grid"])
    mem_grid = tuple(float(m) for m in data["mem_gb_per_gpu_grid"])
    try:
        models = data["profile_sets"][profile_set]
    except KeyError:
        valid = ", ".join(sorted(data["profile_sets"]))
        raise CatalogError(f"unknown profile set {profile_set!r}; valid: {valid}") from None
    catalog: dict[str, SensitivityProfile] = {}
    for name, per_gpu_count in sorted(models.items()):
        entry = per_gpu_count["1"]
        tput = tuple(tuple(float(v) for v in row) for row in entry["tput"])
        if len(tput) != len(cpu_grid) or any(len(row) != len(mem_grid) for row in tput):
            raise CatalogError(f"{name}: tput matrix is not {len(cpu_grid)} x {len(mem_grid)}")
        catalog[name] = SensitivityProfile(
            name=name,
            workload_class=WORKLOAD_CLASSES.get(name, "other"),
            cpu_per_gpu_grid=cpu_grid,
            mem_gb_per_gpu_grid=mem_grid,
            tput=tput,
            best_cpus_per_gpu=float(entry["cpus"]),
            best_mem_gb_per_gpu=float(entry["mem_gb"]),
            speedup=float(entry["speedup"]),
            iter_time_s=float(entry["iter_time_s"]),
            placement_penalty=float(entry.get("placement_penalty", 1.0)),
            interference_kappa=float(entry.get("interference_kappa", 0.0)),
        )
    return catalog


def batch_size_for(model: str, profile_set: str = DEFAULT_PROFILE_SET, path: Path = CATALOG_PATH) -> int:
    """The per-GPU batch of a catalog model (samples per iteration on one GPU)."""
    data = json.loads(path.read_text())
    return int(data["profile_sets"][profile_set][model]["1"]["batch"])


@cache
def load_profiling_inputs(
    path: Path = PROFILING_INPUTS_PATH,
) -> tuple[NodeBandwidth, dict[str, DatasetSpec]]:
    """The MinIO model's inputs for the catalog's models: the profiling node and each model's dataset.

    See profiles_app/data/profiling_inputs.json for where each number comes from.
    """
    data = json.loads(path.read_text())
    node = NodeBandwidth(mem_gbps=float(data["node"]["mem_gbps"]), disk_mbps=float(data["node"]["disk_mbps"]))
    datasets = {
        name: DatasetSpec(
            dataset_gb=float(entry["dataset_gb"]),
            samples=int(entry["samples"]),
            samples_per_iter=batch_size_for(name),
            working_set_gb=float(entry.get("working_set_gb", 0.0)),
        )
        for name, entry in sorted(data["models"].items())
    }
    return node, datasets


def profile_for(model: str, profile_set: str = DEFAULT_PROFILE_SET) -> SensitivityProfile:
    """One model's profile; unknown names raise CatalogError listing the valid ones."""
    catalog = load_catalog(profile_set)
    try:
        return catalog[model]
    except KeyError:
        raise CatalogError(f"unknown model {model!r}; valid: {', '.join(sorted(catalog))}") from None
