"""A fake Redis for the debounce, pacing and cycle keys: SET NX/EX/PX, GET, DELETE, PTTL on a test's clock."""


class FakeRedis:
    """The commands the early-round and forecast-refresh keys use, with expiry on `now` (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.keys: dict[str, tuple[str, float | None]] = {}

    def _live(self, key: str) -> tuple[str, float | None] | None:
        value = self.keys.get(key)
        if value is not None and value[1] is not None and value[1] <= self.now:
            del self.keys[key]
            return None
        return value

    def set(self, key, value, nx=False, ex=None, px=None):
        if nx and self._live(key) is not None:
            return None
        ttl = ex if ex is not None else (px / 1000 if px is not None else None)
        self.keys[key] = (value, None if ttl is None else self.now + ttl)
        return True

    def get(self, key):
        value = self._live(key)
        return None if value is None else value[0]

    def delete(self, key):
        self.keys.pop(key, None)

    def pttl(self, key) -> int:
        value = self._live(key)
        if value is None:
            return -2
        return -1 if value[1] is None else int((value[1] - self.now) * 1000)
