"""Parts of benchmarks/peers_cpu.py: the pure functions (``records``) and the servers (``servers``)."""
