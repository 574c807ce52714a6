"""A job's name when none is given: its workload's, or its command's program, as srun names a job."""

from __future__ import annotations

import os
import shlex


def program_name(command: str) -> str:
    """The file name of a command's program ("python3" for "/usr/bin/python3 train.py"); "" if none."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the service reads the command, and says so
        words = command.split()
    return os.path.basename(words[0]) if words else ""


def default_job_name(workload: str | None, command: str) -> str:
    """The workload's name, else the command's program's; "" when neither names anything."""
    return workload or program_name(command)
