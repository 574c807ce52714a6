"""The user pages: login, job submission, the queue, a job's page and the cluster."""
