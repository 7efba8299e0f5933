"""`infertool verify`: a published checkpoint re-scored against the evidence it carries (evidence.py), under the
recorded engine and settings or another release (engines in infertool.envs.engines), and the bisect of releases."""
