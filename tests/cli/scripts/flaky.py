"""Rank 1 fails on the first attempt only (a marker file remembers it)."""

import os
import sys

marker = sys.argv[1]
if os.environ["RANK"] == "1" and not os.path.exists(marker):
    open(marker, "w").close()
    raise RuntimeError("flaky first attempt")
print(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} ok")
