"""Allocation mechanisms, one per module; importing this package registers every one of them."""

import importlib
import pkgutil

from scheduler_app.core.allocators.base import ALLOCATORS, Allocator, register_allocator

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base",) and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ALLOCATORS", "Allocator", "register_allocator"]
