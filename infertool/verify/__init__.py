"""`infertool verify`: re-score a published checkpoint against the evidence it carries, under the recorded engine
and settings or others (docs/verify.md)."""
