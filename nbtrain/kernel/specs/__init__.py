"""Who each rank is, what it runs and where the ranks meet: the environment and spec of every
rank (rankspec.py), the call shipped to them (payload.py), the rendezvous (rendezvous.py)."""
