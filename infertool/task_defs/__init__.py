"""Built-in worker task definitions, one module per capability. Each module is pure data: a ``TASKS`` list of
``dict(name=, env=, modules=, target=, description=)`` that ``infertool.tasks`` registers, the way a
plugin's would be. Nothing here imports infertool (the target functions are dotted paths)."""
