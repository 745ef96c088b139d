"""Calls across ranks: the transport (``backends``), the handshake every call starts with, the
collectives built on it (gather, reduce, broadcast, pad; misuse detected instead of hanging), and
tensors inside nested containers (``nested``).
"""
