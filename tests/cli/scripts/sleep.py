"""Writes this rank's pid into the directory given as argument, then sleeps."""

import os
import sys
import time

with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
print("ready", flush=True)
time.sleep(120)
