"""Runs specdec's CLI in-process for tests: (exit code, stdout, stderr)."""
from specdec.cli.main import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err
