"""`infertool tune`: which quantization x serving configuration to ship, decided by measurement.

``space`` (candidates x serving grid -> trials, each predicted), ``search`` (the pure decisions), ``stages`` (tune's
registered stages), ``context`` and ``core`` (each trial's graph of stages, the staged work, resumable),
``records`` (the typed results), ``executor`` (local or Ray), ``report`` (tune.md / tune.html), ``classes``
(per traffic class, routing.json) and ``run`` (the entry point).
"""
