"""`infertool tune`: which quantization x serving configuration to ship, decided by measurement.

- ``space``: the candidates (partial quantize sections over the recipe's; "none" = the original), the serving
  grid, the trials (one recipe each), and the roofline's prediction of each trial's decode throughput and cost;
- ``search``: the pure decisions: the load search (largest concurrency that meets the SLO), the early-stopping
  rule for accuracy rounds, the ranking by objective, the Pareto front, why each loser lost;
- ``core``: the staged work (plan prunes, quantize once per candidate, screen accuracy in rounds, measure each
  survivor's capacity, re-check the winner as served), every trial a run directory, resumable;
- ``executor``: trials one after another here, or in parallel on a Ray cluster;
- ``report``: tune.md / tune.html with the Pareto plot, and tuned.yaml.
"""
