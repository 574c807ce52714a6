"""`manage.py node_token NAME`: create the server if missing and print a fresh agent token for it."""

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from cluster_app.models import NodeState, Server
from cluster_app.services import GpuSpec, agent_credential_issue, server_create
from cluster_app.services.nodes import WAITING_FOR_REGISTRATION


class Command(BaseCommand):
    help = (
        "Print a new agent token for server NAME (only its digest is stored). A missing server is "
        "created with placeholder GPUs and stays NOT_RESPONDING, taking no work, until its agent "
        "registers; the agent's registration then replaces the inventory with the real one."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="server name, e.g. gpu01")
        parser.add_argument("--gpus", type=int, default=8, help="placeholder GPUs for a new server (8)")
        parser.add_argument("--cpus", type=int, default=24, help="CPU cores of a new server (24)")
        parser.add_argument("--mem-gb", type=float, default=500.0, help="memory of a new server, GB (500)")
        parser.add_argument("--hostname", default="", help="hostname of a new server")

    @transaction.atomic
    def handle(self, *args, **opts) -> None:
        name = opts["name"]
        server = Server.objects.filter(name=name).first()
        if server is None:
            server = server_create(
                name=name,
                hostname=opts["hostname"],
                num_cpus=opts["cpus"],
                mem_gb=opts["mem_gb"],
                gpus=[GpuSpec(index=i, uuid=f"unregistered-{name}-{i}") for i in range(opts["gpus"])],
                state=NodeState.NOT_RESPONDING,
                state_reason=WAITING_FOR_REGISTRATION,
                registered=False,  # placeholders: no work until its agent registers the real GPUs
            )
            self.stderr.write(f"created server {name} (waiting for its agent to register)")
        # The token alone on stdout, so that scripts can capture it: TOKEN=$(manage.py node_token gpu01)
        self.stdout.write(agent_credential_issue(server=server))
