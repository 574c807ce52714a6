"""The agent's environment file reads the same to a shell as to systemd's EnvironmentFile."""

import re
import subprocess
from pathlib import Path

ENV_FILE = Path(__file__).resolve().parents[2] / "packaging" / "agent" / "attune-agent.env"


def _sourced(text: str, tmp_path: Path) -> dict[str, str]:
    """The ATTUNE_ variables a POSIX shell gets from `set -a; . FILE`."""
    path = tmp_path / "agent.env"
    path.write_text(text)
    result = subprocess.run(
        ["sh", "-c", f'set -a; . "{path}"; env'], capture_output=True, text=True, env={}, check=True
    )
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if line.startswith("ATTUNE_"))


def test_the_shipped_file_sources_in_a_shell(tmp_path):
    values = _sourced(ENV_FILE.read_text(), tmp_path)
    assert values["ATTUNE_SERVER"] == "https://attune.lab.example"
    assert values["ATTUNE_AGENT_ARGS"] == ""


def test_its_example_of_further_options_is_quoted_as_both_readers_take_it(tmp_path):
    """The commented example, uncommented, gives the shell the whole option string (systemd strips the
    quotes the same way and then splits $ATTUNE_AGENT_ARGS into words in ExecStart)."""
    example = re.search(r'^# (ATTUNE_AGENT_ARGS=".+")$', ENV_FILE.read_text(), re.M)
    assert example, "the file shows a quoted ATTUNE_AGENT_ARGS example"
    text = ENV_FILE.read_text().replace("\nATTUNE_AGENT_ARGS=\n", f"\n{example.group(1)}\n")
    assert (
        _sourced(text, tmp_path)["ATTUNE_AGENT_ARGS"]
        == "--name gpu01 --isolation systemd-run --storage-mbps 2000"
    )
