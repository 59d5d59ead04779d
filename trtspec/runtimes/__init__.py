"""Runtimes above the speculation core: ``inflight`` (the in-flight batching engine over slot KV caches, which runs the
draft-target loop for every active sequence) and ``torch`` (loading models, the in-process decoder, sessions, cost
measurement). Importing this package does not import torch."""
