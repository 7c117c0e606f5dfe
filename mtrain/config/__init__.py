"""Typed configuration for every mtrain command, registered in Hydra's ConfigStore.

The YAML files under `configs/` only set values, and only those that differ from the
defaults here; the dataclasses define which keys exist, their types and, for choices, their
allowed values (`Choice` enums), so a typo (`model.d_modle=512`), a wrong type
(`train.lr=fast`) or an unknown choice (`model.activation=rleu`) fails at composition time,
naming the key, before any work starts.

The rules a type cannot say live here too, beside the fields (mtrain.config_fields walks them
for every command before any work, through mtrain.config_checks.check_config):

- a number's range is its field's metadata, written as its default:
  `beam: int = ranged(5, at_least=1)`, `top_p: float = ranged(0.9, above=0, at_most=1)`,
  `train_limit: int | None = ranged(None, at_least=1)` (null passes), with `why=` for what the
  refusal adds (`port: 70000 must be in 0..65535 (0: any free port)`). A new number field
  writes its range so, never as a check elsewhere; every float is refused when inf or nan;
- a rule between keys of one section is that dataclass's `check(self, prefix)` (`prefix`: the
  section's dotted key, e.g. "decode"), raising MtrainError(f"{prefix}.<key>: <why>"); a rule
  between sections is the command's `check` (FitConfig: the guided head against the model);
- what needs the file system or another run (a file exists, a run's config.yaml) stays in
  mtrain.config_checks; so do the decode-combination rules shared with the HTTP APIs.

The modules mirror configs/, and the package mirrors the pipeline: `data/` -> config.data
(mtrain.data), `tokenizer/` -> config.tokenizer, `model/` -> config.model, `train/` ->
config.train, `decode/` -> config.decode; fit.yaml and prepare.yaml -> config.fit; translate,
eval, serve, average, report and export.yaml -> config.commands; `experiment/` presets combine
the groups. Each choice enum sits beside the section that uses it (config.choice holds their
base); config.registry registers the schemas with Hydra, config.convert turns a config into
plain containers or its dataclass. Import a name from here (`from mtrain.config import
DecodeConfig`); the package's own modules import each other by module.
"""

from __future__ import annotations

from mtrain.config.choice import Choice
from mtrain.config.commands import (
    DEFAULT_MAX_LINE_CHARS,
    AverageConfig,
    ConstraintOrder,
    DecodingCommandConfig,
    Engine,
    EvalConfig,
    EvalSplit,
    ExportConfig,
    ExportFormat,
    ReportConfig,
    ServeConfig,
    TranslateConfig,
)
from mtrain.config.convert import to_plain, to_typed, with_values
from mtrain.config.data import (
    SPECIAL_PIECES,
    CleanConfig,
    CorpusConfig,
    DataConfig,
    DataFormat,
    HubConfig,
    InvalidUtf8,
    Normalization,
    SplitsConfig,
    SubwordSamplingConfig,
    check_corpora,
    corpora_rules,
    source_with_several_targets,
)
from mtrain.config.decode import (
    DEFAULT_ALIGNMENT_LAYER,
    AlignmentLevel,
    AlignmentRule,
    DecodeConfig,
    DecodeWeights,
    MbrCandidates,
    MbrConfig,
    MbrUtility,
    RerankConfig,
    Sampling,
    TermMode,
    TermPlacement,
    alignment_level,
)
from mtrain.config.fit import FitConfig, InitVocab, is_hub_id, with_resolved_model
from mtrain.config.model import (
    Activation,
    AttentionImpl,
    DecoderOrder,
    ModelConfig,
    NormPosition,
    NormType,
    OutputVocab,
    Positions,
    ResidualInput,
    check_model_config,
    resolved_model,
)
from mtrain.config.registry import APP_SCHEMAS, register_configs
from mtrain.config.tokenizer import TokenizerConfig, TokenizerModel
from mtrain.config.train import Precision, Scheduler, TrainConfig

__all__ = [
    "APP_SCHEMAS",
    "DEFAULT_ALIGNMENT_LAYER",
    "DEFAULT_MAX_LINE_CHARS",
    "SPECIAL_PIECES",
    "Activation",
    "AlignmentLevel",
    "AlignmentRule",
    "AttentionImpl",
    "AverageConfig",
    "Choice",
    "CleanConfig",
    "ConstraintOrder",
    "CorpusConfig",
    "DataConfig",
    "DataFormat",
    "DecodeConfig",
    "DecodeWeights",
    "DecoderOrder",
    "DecodingCommandConfig",
    "Engine",
    "EvalConfig",
    "EvalSplit",
    "ExportConfig",
    "ExportFormat",
    "FitConfig",
    "HubConfig",
    "InitVocab",
    "InvalidUtf8",
    "MbrCandidates",
    "MbrConfig",
    "MbrUtility",
    "ModelConfig",
    "NormPosition",
    "NormType",
    "Normalization",
    "OutputVocab",
    "Positions",
    "Precision",
    "ReportConfig",
    "RerankConfig",
    "ResidualInput",
    "Sampling",
    "Scheduler",
    "ServeConfig",
    "SplitsConfig",
    "SubwordSamplingConfig",
    "TermMode",
    "TermPlacement",
    "TokenizerConfig",
    "TokenizerModel",
    "TrainConfig",
    "TranslateConfig",
    "alignment_level",
    "check_corpora",
    "check_model_config",
    "corpora_rules",
    "is_hub_id",
    "register_configs",
    "resolved_model",
    "source_with_several_targets",
    "to_plain",
    "to_typed",
    "with_resolved_model",
    "with_values",
]
