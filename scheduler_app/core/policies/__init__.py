"""Scheduling policies, one per module; importing this package registers every one of them."""

import importlib
import pkgutil

from scheduler_app.core.policies.base import POLICIES, Policy, register_policy

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["POLICIES", "Policy", "register_policy"]
