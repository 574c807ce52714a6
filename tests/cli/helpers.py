"""Running the command line in-process, as a user at a terminal would, and reading what it printed."""

from __future__ import annotations

from cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Exit status, standard output and standard error of `python -m cli ARGV...`."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(capsys, *argv: str) -> str:
    """What argparse says to a command it refuses (it exits with status 2 before anything is sent)."""
    try:
        main(list(argv))
    except SystemExit as exc:
        assert exc.code == 2
        return capsys.readouterr().err
    raise AssertionError(f"{argv} was accepted")
