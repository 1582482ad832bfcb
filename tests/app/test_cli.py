"""The `tokentrace` command dispatches to the module `python -m` would run, with the
same arguments: no subcommand (or server options) is python -m app, `lab` is
python -m app.lab, `checkpoint` is python -m engine.checkpoint."""
from __future__ import annotations

import sys

import pytest

from app.cli import dispatch, main

# runpy warns when a test before this one imported app.__main__ (python -m never has)
pytestmark = pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")


def help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_no_subcommand_is_the_server(capsys):
    out = help_of(["--help"], capsys)
    assert "usage: python -m app " in out and "--model" in out
    assert "tokentrace lab" in out and "tokentrace checkpoint" in out  # the subcommands are named


def test_lab_is_python_m_app_lab(capsys):
    out = help_of(["lab", "--help"], capsys)
    assert "usage: python -m app.lab" in out and "--size" in out


def test_checkpoint_is_python_m_engine_checkpoint(capsys):
    out = help_of(["checkpoint", "--help"], capsys)
    assert "usage: python -m engine.checkpoint" in out and "fetch" in out


def test_server_options_go_to_the_server_and_argv_is_restored(capsys):
    before = list(sys.argv)
    with pytest.raises(SystemExit) as done:
        main(["--port", "not-a-port"])  # argparse refuses it before anything loads
    assert done.value.code == 2
    assert "python -m app: error" in capsys.readouterr().err
    assert sys.argv == before


def test_dispatch():
    assert dispatch([]) == ("app", [])
    assert dispatch(["--model", "smollm2"]) == ("app", ["--model", "smollm2"])
    assert dispatch(["lab", "batching", "--size", "ci"]) == ("app.lab", ["batching", "--size", "ci"])
    assert dispatch(["checkpoint", "list"]) == ("engine.checkpoint", ["list"])
