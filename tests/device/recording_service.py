"""A recording stand-in for the service on a GPU machine that cannot reach one (see README.md).

Answers the agent's register and syncs minimally, hands out the start commands of a file once (their
GPUs replaced by the ones the agent registered, as the service would assign them) and appends every
request body to a JSON-lines file: `python recording_service.py PORT OUT.jsonl [COMMANDS.json]`.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar


class RecordingHandler(BaseHTTPRequestHandler):
    out: ClassVar[Path]
    commands: ClassVar[list[dict[str, Any]]] = []
    registered_uuids: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with self.out.open("a") as out:
            out.write(json.dumps({"path": self.path, "body": body}) + "\n")
        answer: dict[str, Any] = {"sync_interval_s": 1}
        if self.path.endswith("/register"):
            RecordingHandler.registered_uuids = [gpu["uuid"] for gpu in body["gpus"]]
            answer["server"] = body["hostname"]
        elif self.commands:
            answer["commands"], RecordingHandler.commands = self.commands, []
            for command in answer["commands"]:
                command["gpu_uuids"] = self.registered_uuids[: len(command.get("gpu_uuids") or [])]
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    port, out = int(sys.argv[1]), Path(sys.argv[2])
    RecordingHandler.out = out
    if len(sys.argv) > 3:
        RecordingHandler.commands = json.loads(Path(sys.argv[3]).read_text())
    ThreadingHTTPServer(("127.0.0.1", port), RecordingHandler).serve_forever()


if __name__ == "__main__":
    main()
