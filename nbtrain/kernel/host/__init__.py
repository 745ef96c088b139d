"""What the kernel process is and has (the lowest layer of the kernel side): the one reader of
``os.environ`` and of the machine's devices (environment.py), notebook cells by the names the
notebook shows (cellnames.py), the line that first touched CUDA (cuda_origin.py), and whether a
human can answer a prompt here (stdin.py)."""
