"""Data: the prepared dataloaders (``prepared``, built by ``loaders``, configured by
``loaderconfig``), who gets which samples (``sharding``, ``splitting``, ``batches``, ``permuted``,
``shuffling``) and the main process sending each rank its rows (``dispatch``).
"""
