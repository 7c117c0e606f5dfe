"""Each command's schema by config name, registered in Hydra's ConfigStore."""

from __future__ import annotations

from mtrain.config.commands import AverageConfig, EvalConfig, ExportConfig, ReportConfig, ServeConfig, TranslateConfig
from mtrain.config.data import DataConfig
from mtrain.config.decode import DecodeConfig
from mtrain.config.fit import FitConfig
from mtrain.config.model import ModelConfig
from mtrain.config.tokenizer import TokenizerConfig
from mtrain.config.train import TrainConfig

# The schema of each command's config, by config name (configs/<name>.yaml).
APP_SCHEMAS = {
    "fit": FitConfig,
    "prepare": FitConfig,
    "translate": TranslateConfig,
    "serve": ServeConfig,
    "eval": EvalConfig,
    "average": AverageConfig,
    "report": ReportConfig,
    "export": ExportConfig,
}


def register_configs() -> None:
    """Register the schemas so YAML files in configs/ are validated against them."""
    # Imported here, not above: the data layer's typed signatures import mtrain.config, and
    # encoding worker processes should not pay Hydra's import (0.2 s) for them.
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="fit_schema", node=FitConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="serve_schema", node=ServeConfig)
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(name="average_schema", node=AverageConfig)
    cs.store(name="report_schema", node=ReportConfig)
    cs.store(name="export_schema", node=ExportConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="tokenizer", name="tokenizer_schema", node=TokenizerConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="train", name="train_schema", node=TrainConfig)
    cs.store(group="decode", name="decode_schema", node=DecodeConfig)
