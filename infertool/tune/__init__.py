"""`infertool tune`: which quantization x serving configuration to ship, decided by measurement.

- ``space``: the candidates (partial quantize sections over the recipe's; "none" = the original), the serving
  grid, the trials (one recipe each), and the roofline's prediction of each trial's decode throughput and cost;
- ``search``: the pure decisions: the load search (largest concurrency that meets the SLO), the early-stopping
  rule for accuracy rounds, the ranking by objective, the Pareto front, why each loser lost;
- ``stages``: tune's stages (reference, screen, capacity, served), listed in the one stage registry
  (``infertool.stages.registry``) beside `run`'s quantize, which tune runs without its load check;
- ``context``: what one tune shares, and the runner of each trial's graph of stages (built from the registry,
  cached under the keys the declarations give);
- ``core``: the staged work (plan prunes, quantize once per candidate, screen accuracy in rounds, measure each
  survivor's capacity, re-check the winner as served), every trial a record and a directory, resumable;
- ``records``: the typed results (TrialRecord, ScreenResult, CapacityResult, TuneDoc, ...);
- ``executor``: trials one after another here, or in parallel on a Ray cluster;
- ``report``: tune.md / tune.html with the Pareto plot, and tuned.yaml.
"""
