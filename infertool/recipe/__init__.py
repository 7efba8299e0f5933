"""The recipe: pydantic v2 models of the one YAML file that drives every command, and its loader.

Every model forbids unknown keys. ``load_recipe`` turns everything a user can get wrong (a missing
file, a YAML syntax error, a duplicate key, an unknown field, a value out of range, a bad
``--set`` override) into a ``UsageError`` or a ``RecipeError`` that lists EVERY issue found, each
with its dotted path (``quantize.group_size``, ``profile.batch[1]``) and, when known, the line and
column in the YAML file. Model-dependent checks (does group_size divide the hidden size?) are not
done here; they belong to the quantize preflight.

The sections: sections (model, quantize, eval, profile, target), serve, bench, tune, root (verify, run and
the Recipe itself); the YAML and overrides: parse; loading: load; pydantic errors as RecipeIssues: issues.
This package imports only pydantic and PyYAML: importing it must stay cheap.
"""

from infertool.backends.bnb import BNBConfig
from infertool.backends.methods import AWQConfig, GPTQConfig
from infertool.recipe.bench import BenchSection, PerClassSpec, PromptSpec, RateSweepSpec, RepeatSpec, SLOSpec
from infertool.recipe.issues import MAX_LISTED_ISSUES
from infertool.recipe.load import (
    MAX_RECIPE_BYTES, load_recipe, load_recipe_data, recipe_to_dict, validate_recipe_data,
)
from infertool.recipe.parse import Override, apply_overrides, parse_overrides
from infertool.recipe.root import EvidenceSpec, Recipe, SigningSpec, VerifyAccept, VerifySection
from infertool.recipe.sections import (
    QUANTIZE_METHODS, AcceptSpec, DecodeSpec, EvalSection, LmEvalSpec, ProfileSection, QuantizeSection, TargetSection,
)
from infertool.recipe.serve import LoraSpec, ServeSection, SpeculativeSpec
from infertool.recipe.tune import (
    MAX_TUNE_CLASSES, ServeGrid, TuneLoadSearch, TuneMachine, TuneRouting, TuneSection, ray_accelerator_type,
)
from infertool.schema import MAX_REQUESTS

__all__ = [
    "MAX_LISTED_ISSUES", "MAX_RECIPE_BYTES", "MAX_REQUESTS", "MAX_TUNE_CLASSES", "QUANTIZE_METHODS",
    "AWQConfig", "AcceptSpec", "BNBConfig", "BenchSection", "DecodeSpec", "EvalSection", "EvidenceSpec", "GPTQConfig",
    "LmEvalSpec", "Override", "PerClassSpec", "ProfileSection", "PromptSpec", "QuantizeSection", "RateSweepSpec",
    "LoraSpec", "Recipe", "RepeatSpec", "SLOSpec", "ServeGrid", "ServeSection", "SpeculativeSpec", "TargetSection",
    "SigningSpec", "TuneLoadSearch", "TuneMachine", "TuneRouting", "TuneSection", "VerifyAccept", "VerifySection",
    "apply_overrides", "load_recipe", "load_recipe_data", "parse_overrides", "ray_accelerator_type", "recipe_to_dict",
    "validate_recipe_data",
]
