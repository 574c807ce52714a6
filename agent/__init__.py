"""Attune node agent: a standalone program (httpx, psutil, nvidia-ml-py) that never imports Django."""

__version__ = "1.0.0"
