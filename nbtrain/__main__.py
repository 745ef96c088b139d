"""``python -m nbtrain ...``: the same as the ``nbtrain`` command."""


from nbtrain.kernel.cli.commands import main, run

__all__ = ["main", "run"]  # main: what console scripts made by older installs import

if __name__ == "__main__":
    run()
