"""`infertool run`: the run graph (model -> quantize -> eval -> profile -> serve -> bench, as the stage registry
declares them) into one run directory with one manifest.

The graph comes from ``infertool.stages``: the stages the recipe asks for (or ``--stages`` / run.stages) with
the stages they depend on, each with its key (the recipe sections it reads, its inputs by content, its upstream
stages' keys; ``infertool.stages.stage_key``) and its entry in the stage cache ``<out_dir>/.stages/<stage>-<key>/``
(``infertool.stages.cache``): written to a temporary directory and renamed when complete, so an interruption
never leaves a half-written entry; a re-run reuses completed entries by key and continues where the last run
stopped. The run directory ``<out_dir>/<recipe>-<timestamp>/`` links each stage's entry and holds
``manifest.json`` (``infertool.summaries.RunManifest``: resolved recipe, input hashes, environment versions,
each stage's status, timings and summary).

The stages that serve (declared ``server``: serve's check, bench's arms, eval's and profile's vllm engines)
share the run's servers (``infertool.serve.pool``): one vLLM start per distinct launch, quantize's load check
included (its server serves the checkpoint the stage publishes, with the recipe's serve settings: serve's check
and bench share it). A stage that runs an engine in-process (declared ``device``: quantize, hf eval, hf profile)
gets the device first: on a GPU every pooled server stops before it; on a CPU idle servers stay while memory
allows, paused (SIGSTOP) until a stage asks for a server (a ``times_host`` stage records the CPU time they took
beside it). The manifest's ``servers`` lists each server started (who started it, who used it, its start-up
seconds and log, where its model moved, what it was paused for), and each stage's record says which servers it
used (started or reused).
"""

from infertool.pipeline.graph import plan_pipeline, selected_stages
from infertool.pipeline.runner import RunResult, run_pipeline

__all__ = ["RunResult", "plan_pipeline", "run_pipeline", "selected_stages"]
