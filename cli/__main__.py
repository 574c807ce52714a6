"""Entry point: `python -m cli COMMAND ...` (see `python -m cli --help`)."""

from cli.main import main

raise SystemExit(main())
