"""`mtrain export run=RUN format=ctranslate2 out=DIR [quantization=int8]`: a run for an inference engine.

    mtrain export run=outputs/DATE/TIME format=ctranslate2 out=model_ct2
    mtrain export run=outputs/DATE/TIME out=model_ct2_int8 quantization=int8 checkpoint=last
    mtrain translate run=model_ct2 engine=ctranslate2 input=test.de output=test.en

The work is in `mtrain.export`; what is exported and what is refused is listed in
`mtrain/export/ctranslate2_spec.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from mtrain.cli.common import CONFIG_DIR, user_errors_as_messages
from mtrain.errors import MtrainError

FORMATS = ("ctranslate2",)


@dataclass
class ExportConfig:
    run: Optional[str] = None  # a run directory written by `mtrain fit`
    checkpoint: str = "best"  # best | last | a path
    format: str = "ctranslate2"
    out: Optional[str] = None  # the model directory to write
    quantization: Optional[str] = None  # null (fp32) | int8 | int8_float16 | int16 | float16 | bfloat16 ...
    force: bool = False  # replace an existing `out`


ConfigStore.instance().store(name="export_schema", node=ExportConfig)


def run_export(cfg: DictConfig) -> Path:
    from mtrain.export import export_run

    if cfg.run is None:
        raise MtrainError("run=RUN_DIR is missing: give the directory `mtrain fit` wrote (outputs/DATE/TIME)")
    if cfg.format not in FORMATS:
        raise MtrainError(f"format={cfg.format}: choose one of {'|'.join(FORMATS)}")
    if cfg.out is None:
        raise MtrainError("out=DIR is missing: the directory to write the exported model into")
    out = export_run(Path(cfg.run), Path(cfg.out), which=cfg.checkpoint, quantization=cfg.quantization,
                     force=cfg.force)
    print(f"exported {cfg.run} ({cfg.checkpoint}, {cfg.quantization or 'float32'}) to {out}; "
          f"translate with: mtrain translate run={out} engine=ctranslate2 input=FILE")
    return out


@hydra.main(config_path=CONFIG_DIR, config_name="export", version_base="1.3")
@user_errors_as_messages
def main(cfg: DictConfig) -> None:
    run_export(cfg)


if __name__ == "__main__":
    main()
