"""Isolated backend environments: one managed venv per backend family, and the worker protocol.

No single environment can hold today's quantizers and vLLM together (see docs/environments.md), so each
backend runs in a venv that holds exactly what it needs, under ``$INFERTOOL_HOME/envs/<name>``.
"""

from infertool.envs.paths import env_dir, envs_root, home

__all__ = ["env_dir", "envs_root", "home"]
