"""Name -> class registries for policies and allocators, with errors that list the valid names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """Raised for a policy or allocator name that is not registered; the message lists valid ones."""


class Registry(Generic[T]):
    """A small name -> class table; `kind` is used in error messages ("policy", "allocator")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def decorator(cls: type[T]) -> type[T]:
            if name in self._classes:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._classes[name] = cls
            cls.name = name  # type: ignore[attr-defined]
            return cls

        return decorator

    def names(self) -> list[str]:
        return sorted(self._classes)

    def get(self, name: str) -> type[T]:
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}"
            ) from None
