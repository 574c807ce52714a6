"""Per-user notifications of job events (end, failure, QoS at risk) by email and webhook."""
