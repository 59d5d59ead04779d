"""The speculation core: what every draft-target path shares, with no runtime underneath it.

- ``rules``: the draft-length rule (``MAX_DRAFT_LEN``), ``SamplingParams`` and ``SpecStats`` (torch-free);
- ``drafters``: the drafter registry (``drafters.registry``: what each kind needs, which runtimes and orchestrations
  serve it, how a process builds it) and one module per drafter (n-gram, hybrid, adaptive);
- ``acceptance`` and ``sampling``: the one acceptance routine (lossless greedy and rejection sampling; torch);
- ``speedup``: the cost model (tokens per target step, c, v, exact simulation; torch-free);
- ``adaptive``: the per-sequence choice of drafter and K, from ``arms`` (acceptance estimates), ``pass_costs`` (cost
  curves) and ``choice`` (one step's pricing); ``gate`` (the BLS batch gate) and ``replay`` (the policy replayed on
  reference answers) build on it (all torch-free);
- ``words``: stop and bad words.

The runtimes (``trtspec.runtimes``) and the Triton orchestrator build on it; it imports none of them.
Importing this package imports nothing else.
"""
