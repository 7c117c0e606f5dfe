"""`mtrain export run=RUN format=ctranslate2|hf|argos out=DIR`: a run for an inference engine, for transformers or for Argos Translate.

    mtrain export run=outputs/DATE/TIME format=ctranslate2 out=model_ct2
    mtrain export run=outputs/DATE/TIME out=model_ct2_int8 quantization=int8 checkpoint=last
    mtrain translate run=model_ct2 input=test.de output=test.en     # CTranslate2 decodes an export
    mtrain export run=outputs/DATE/TIME format=argos out=de_en.argosmodel   # for Argos Translate
    mtrain export run=outputs/DATE/TIME format=hf out=model_hf              # for Hugging Face transformers

The work is in `mtrain.export`; what is exported and what is refused is listed in
`mtrain/export/ctranslate2_spec.py` (format=ctranslate2), `mtrain/export/argos.py` (format=argos)
and `mtrain/export/hf_model.py` (format=hf).
"""

from __future__ import annotations

from pathlib import Path

from mtrain.cli.common import mtrain_app
from mtrain.config import ExportConfig, ExportFormat
from mtrain.errors import MtrainError


def run_export(cfg: ExportConfig) -> Path:
    from mtrain.export import export_hf_run, export_run

    if cfg.run is None:
        raise MtrainError("run=RUN_DIR is missing: give the directory `mtrain fit` wrote (outputs/DATE/TIME)")
    if cfg.out is None:
        raise MtrainError("out=DIR is missing: the directory to write the exported model into")
    if cfg.format == ExportFormat.argos:
        return run_export_argos(cfg)
    if cfg.format == ExportFormat.hf:
        if cfg.quantization is not None:
            raise MtrainError(
                f"quantization={cfg.quantization}: format=hf writes float32 weights; quantize with format=ctranslate2"
            )
        out = export_hf_run(Path(cfg.run), Path(cfg.out), which=cfg.checkpoint, force=cfg.force, weights=cfg.weights)
        print(
            f"exported {cfg.run} ({cfg.checkpoint}, float32) to {out}; load it with "
            f"AutoModelForSeq2SeqLM.from_pretrained('{out}') and AutoTokenizer.from_pretrained('{out}')"
        )
        return out
    out = export_run(
        Path(cfg.run),
        Path(cfg.out),
        which=cfg.checkpoint,
        quantization=cfg.quantization,
        force=cfg.force,
        weights=cfg.weights,
    )
    print(
        f"exported {cfg.run} ({cfg.checkpoint}, {cfg.quantization or 'float32'}) to {out}; "
        f"translate with: mtrain translate run={out} input=FILE (CTranslate2 decodes it)"
    )
    return out


def run_export_argos(cfg: ExportConfig) -> Path:
    from mtrain.export.argos import export_argos
    from mtrain.export.argos_score import scoring_command

    assert cfg.run is not None and cfg.out is not None
    out, scored = export_argos(
        Path(cfg.run),
        Path(cfg.out),
        which=cfg.checkpoint,
        quantization=cfg.quantization,
        force=cfg.force,
        weights=cfg.weights,
        score=cfg.score,
    )
    print(
        f"exported {cfg.run} ({cfg.checkpoint}, {cfg.quantization or 'float32'}) to {out}; install with: "
        f"python -c \"import argostranslate.package as p; p.install_from_path('{out}')\""
    )
    print(
        scored
        or f"score: skipped (score=false); Argos decodes with beam 4, length penalty 0.2: {scoring_command(Path(cfg.run))}"
    )
    return out


@mtrain_app("export")
def main(cfg: ExportConfig) -> None:
    run_export(cfg)


if __name__ == "__main__":
    main()
