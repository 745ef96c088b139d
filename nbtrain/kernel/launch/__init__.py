"""The launch kinds, side by side and none importing another: in the kernel itself
(inprocess.py), ranks on this machine (local.py), torch_xla's host process (xla.py), torch's
elastic agent (elastic/), ranks placed by Ray (cluster/); the chooser above them (choose.py)."""
