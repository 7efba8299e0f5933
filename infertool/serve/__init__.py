"""vLLM's OpenAI-compatible server, launched ONE way for everything that needs one: ``infertool serve``,
bench (each experiment arm), eval's vllm engine, profile's vllm engine, quantize's load check, run and
tune. What you serve is what you test: each takes the recipe's resolution (``infertool.resolve``) and
its effective serve settings; only what a purpose needs on top is added (eval: --max-logprobs), and
each server is its own process group, stopped before the next one starts.

- ``prepare(res, ...) -> LaunchPlan``: the exact command and environment, the lint, the KV cache plan;
  starts nothing (a dry run is just this, printed). An internal server asks for no port: the launcher picks a
  free one when it starts it (``infertool.serve.launcher``); ``infertool serve`` passes serve.port.
- ``launch(plan, log)``: a context manager that starts the server, waits until it answers, yields a
  ``Launched`` (URL, served name, API key) and always stops the whole process group.
- ``launch(plan, log, pool=pool)``: the same through a run's ``ServerPool`` (``infertool.serve.pool``): a
  server of the same launch already running is shared, and the pool, not the caller, stops it.
- ``plan(res, ServeOptions) -> ServePlan`` / ``run(plan, ctx) -> ServeResult``: `infertool serve`'s capability
  (the foreground server until Ctrl-C, ``--detach`` with its pid file; ``status`` / ``stop`` of detached
  servers; ``--emit k8s``): ``infertool.serve.lifecycle``.

Nothing here imports vLLM: the server runs in the managed ``serve`` environment.
"""

from infertool.serve.launches import LaunchPlan, Launched, default_log_path, launch, prepare, require_server_env
from infertool.serve.lifecycle import ServeOptions, ServePlan, ServeResult, plan, run

__all__ = ["LaunchPlan", "Launched", "ServeOptions", "ServePlan", "ServeResult", "default_log_path", "launch", "plan",
           "prepare", "require_server_env", "run"]
