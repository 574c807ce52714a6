"""Attune's pure scheduling core: plain Python and numpy/scipy, never Django, no I/O, no clock."""
