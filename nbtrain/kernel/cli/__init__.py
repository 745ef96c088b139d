"""The ``nbtrain`` command: ``launch`` a script on ranks, ``env``, ``demo`` (commands.py), and how
it hears its signals and ends (command_exit.py)."""

from nbtrain.kernel.cli.commands import run

__all__ = ["run"]
