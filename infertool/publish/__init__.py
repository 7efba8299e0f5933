"""The artifact you ship: the checkpoint a run (or a tune) evaluated, copied whole to where it is served from,
with a model card beside it, and checked by content before anything serves it.

- ``checkpoint``: a checkpoint folder's entries, what publish refuses in it, its content ``fingerprint``;
- ``facts``: the records publish writes and reads back: ``infertool.json`` (``CardFacts``), the manifest's
  ``published`` and a tune's ``published.json`` (``Published``), a run's facts, a card nothing vouches for;
- ``card``: MODEL_CARD.md; ``folder``: where a published folder may go, and the copy (``publish_dir``);
- ``served``: what ``infertool serve RUN_DIR | TUNE_DIR | RECIPE`` means, the fingerprint checked;
- ``command``: `infertool publish SRC DEST` (``plan`` / ``run``: a directory; ``s3://`` and ``hf://`` through
  boto3 and huggingface_hub, printed as calls with ``dry_run``).

The evidence beside the weights is written through ``infertool.verify.capture``; verify never imports publish.
"""

from infertool.publish.card import model_card
from infertool.publish.checkpoint import CARD, EVIDENCE, FACTS, MAX_DEPTH, fingerprint, refusals, said, short
from infertool.publish.command import PublishOptions, PublishPlan, PublishResult, plan, run, source_recipe
from infertool.summaries import Published
from infertool.publish.facts import (FACTS_VERSION, TUNE_PUBLISHED, CardFacts, gate_rows, published_record,
                                     read_facts, run_facts, serve_commands)
from infertool.publish.folder import (check_dest, env_folders, forbidden_for_run, ownership_refusal, publish_dir,
                                      publish_run, run_destination)
from infertool.publish.served import ServeTarget, recipe_of_run, served

__all__ = ["CARD", "EVIDENCE", "FACTS", "FACTS_VERSION", "MAX_DEPTH", "TUNE_PUBLISHED", "CardFacts", "PublishOptions",
           "PublishPlan", "PublishResult", "Published", "ServeTarget", "check_dest", "env_folders", "fingerprint",
           "forbidden_for_run", "gate_rows", "model_card", "ownership_refusal", "plan", "publish_dir", "publish_run",
           "published_record", "read_facts", "recipe_of_run", "refusals", "run", "run_destination", "run_facts",
           "said", "serve_commands", "served", "short", "source_recipe"]
