"""Entry point: `python -m agent --server URL --token TOKEN ...`."""

from agent.cli import main

raise SystemExit(main())
