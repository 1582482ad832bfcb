"""The `tokentrace` command (pyproject.toml's console script): one entry point for the
project's three `python -m` commands.

    tokentrace [server options]      python -m app [server options]
    tokentrace lab ...               python -m app.lab ...
    tokentrace checkpoint ...        python -m engine.checkpoint ...

Each runs its module as `python -m` would (runpy, in this process), so the command and the
module take the same arguments and print the same help.
"""
from __future__ import annotations

import runpy
import sys

SERVER = "app"
SUBCOMMANDS = {"lab": "app.lab", "checkpoint": "engine.checkpoint"}
USAGE = ("tokentrace [server options]  |  tokentrace lab ...  |  tokentrace checkpoint ...\n"
         "(the same as python -m app, python -m app.lab, python -m engine.checkpoint)\n")


def dispatch(argv: list[str]) -> tuple[str, list[str]]:
    """The module to run and its arguments: a subcommand's, else the server's."""
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]], argv[1:]
    return SERVER, argv


def run_module(module: str, args: list[str]) -> None:
    """`python -m module args` here: sys.argv as python -m sets it, put back after."""
    saved = sys.argv
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    module, args = dispatch(argv)
    if module == SERVER and args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE + "\n")  # the subcommands, above the server's own help
    run_module(module, args)


if __name__ == "__main__":
    main()
