"""The package version, in one place: nbtrain/__init__, the command line, the environment report,
the Ray node check and pyproject.toml (setuptools reads it) all take it from here."""

__version__ = "0.1.0"
