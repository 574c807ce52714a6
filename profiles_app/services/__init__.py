"""Every state change of workload knowledge, by subject: the catalog, profiling runs, observed speeds."""
