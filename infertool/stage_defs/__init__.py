"""Built-in stage definitions, one module per capability. Each module is pure data: a ``STAGES`` list of
``dict(name=, env=, modules=, target=, description=)`` that ``infertool.stages`` registers, the way a
plugin's would be. Nothing here imports infertool (the target functions are dotted paths)."""
