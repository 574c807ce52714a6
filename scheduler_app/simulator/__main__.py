"""`python -m scheduler_app.simulator`: the simulator's command line, without Django (simulator/cli.py)."""

import sys

from scheduler_app.simulator.cli import main

sys.exit(main())
