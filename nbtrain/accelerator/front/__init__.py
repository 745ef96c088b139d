"""The Accelerator front end: the class (``core``), assembled from parts that delegate to the
concerns beside this package (``base``, ``prepare``, ``training``, ``processes``, ``state``);
Accelerate's state view and arguments (``compat``, ``handlers``) and free functions
(``operations``).
"""
