"""Serializers of the REST API by subject: agents (the node protocol), jobs, cluster."""
