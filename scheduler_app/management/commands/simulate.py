"""`manage.py simulate`: replay a trace under several policies and allocators and compare them.

The options, the request and the table are the Django-free command line's (simulator/cli.py,
`python -m scheduler_app.simulator`, which starts in a fraction of the time); this command adds
`--store` (record the comparison as a SimulationRun).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler_app.services.simulations import (
    SimulationRequest,
    SimulationRequestError,
    simulation_compare,
    simulation_run_create,
    simulation_run_execute,
    simulation_trace_build,
)
from scheduler_app.simulator import TraceError, write_trace
from scheduler_app.simulator.cli import add_arguments, progress_printer, request_from_options, table_lines


class Command(BaseCommand):
    help = (
        "Simulate a job trace on a cluster under one or more policies and allocators (the same scheduling "
        "core the live service runs) and print one row per combination: average, p99 JCT, makespan, GPU "
        "allocation and the speed-up of average JCT over the proportional allocator. Without --store, "
        "`python -m scheduler_app.simulator` takes the same options and needs no Django."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser)
        out = parser.add_argument_group("output")
        out.add_argument("--json", metavar="OUT", help="write {'runs': [...]} with every figure to OUT")
        out.add_argument("--store", action="store_true", help="also record the comparison as a SimulationRun")
        out.add_argument("--quiet", action="store_true", help="no progress lines")

    def handle(self, *args: Any, **opts: Any) -> None:
        request = self._request(opts)
        try:
            trace = simulation_trace_build(request)
        except TraceError as exc:
            raise CommandError(str(exc)) from None
        except SimulationRequestError as exc:
            raise CommandError(str(exc)) from None
        if opts["save_trace"]:
            write_trace(opts["save_trace"], trace)
        progress = None if opts["quiet"] else progress_printer()
        try:
            if opts["store"]:
                run = simulation_run_create(request=request)
                runs = simulation_run_execute(run=run, trace=trace).results["runs"]
                self.stdout.write(f"stored as SimulationRun {run.pk}")
            else:
                runs = simulation_compare(request, trace=trace, progress=progress)
        except (SimulationRequestError, TraceError) as exc:
            raise CommandError(str(exc)) from None
        for line in table_lines(runs):
            self.stdout.write(line)
        if opts["json"]:
            Path(opts["json"]).write_text(json.dumps({"request": request.to_json(), "runs": runs}, indent=1))
            self.stdout.write(f"wrote {opts['json']}")

    def _request(self, opts: dict[str, Any]) -> SimulationRequest:
        try:
            return request_from_options(opts)
        except SimulationRequestError as exc:
            raise CommandError(str(exc)) from None
