"""One launch as the cell sees it: its lifecycle (lifecycle.py: state, view, interrupt, timeout,
the one ending), rank output as the cell's own (cellout.py), tracebacks that show the user's
code (tracebacks.py), and where each rank is (where.py)."""
