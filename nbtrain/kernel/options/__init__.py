"""What the user asked, checked once before anything starts: the options as passed
(requested.py), the processes' configuration (config.py), Accelerate's launcher parameters
(accelerate.py), stop and resume (stopping.py), ``debug=`` (debug.py), how messages name an
option (names.py), and the launch interface types every kind implements (interface.py)."""
