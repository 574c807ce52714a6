"""Prometheus metrics at /metrics: a collector that reads the database at scrape time (docs/metrics.md)."""

from scheduler_app.metrics.collector import AttuneCollector, metrics_registry

__all__ = ["AttuneCollector", "metrics_registry"]
