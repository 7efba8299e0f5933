"""Moved to infertool.backends (one module per backend, one registry). These views of the registry stay while
other modules still read them (tune/run.py); remove them once those read ``infertool.backends`` directly."""

from infertool.backends import all_backends

BACKEND_ENVS = {b.name: b.env for b in all_backends() if b.in_recipe}
BACKEND_TASKS = {b.name: b.task for b in all_backends() if b.in_recipe}
