"""The REST API (DRF) under /api/v1/: agent endpoints, jobs, cluster overview and server drain."""
