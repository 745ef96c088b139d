"""Operating-system processes of ranks: start them under fork / forkserver / spawn
(processes.py), what the kernel holds of each and whether it has exited (handles.py), signal,
stop and reap them (reaping.py), and what starting needs: the forkserver (forkserver.py) and the
kernel's warm-up (warmup.py), the fork-time garbage collector pause (fork_gc.py), signals held
while forking (signal_hold.py), shared memory left by killed ranks (shm.py)."""
