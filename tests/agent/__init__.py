"""Tests of the node agent (no Django)."""
