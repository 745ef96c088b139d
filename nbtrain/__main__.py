"""``python -m nbtrain ...``: the same as the ``nbtrain`` command."""

import sys

from nbtrain.kernel.cli import main

if __name__ == "__main__":
    sys.exit(main())
