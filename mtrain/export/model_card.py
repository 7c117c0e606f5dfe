"""The model card (README.md) of a transformers export: what the model was trained on, how,
and how well, from what the run directory recorded.

    front matter    languages, library, tags, and a model-index with every metric of the run's
                    evaluation reports (eval/*.json); no pipeline tag: transformers 5 has no
                    translation pipeline, and a tag would promise one
    Use             loading and generating (AutoTokenizer + generate, which transformers 5 runs),
                    the target-language tag of a multilingual run, mtrain's per-sentence length limit
    Data            each training corpus with its pairs kept and tokens (metrics.json), the
                    evaluation splits, the tokenizer
    Model           the architecture as mtrain built it, and as transformers runs it
    Training        the command's overrides, updates, time, stop reason, the exported checkpoint
    Evaluation      every report: split, direction, checkpoint, decoding, each metric with its
                    sacreBLEU signature
    Configuration   the run's whole stored config

Paths of the exporting machine (a corpus folder, the run directory in the command's overrides)
are cut to their last name (mtrain.export.portable): the card is published.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from omegaconf import OmegaConf

from mtrain import __version__
from mtrain.config import resolved_model, to_plain
from mtrain.export.portable import portable
from mtrain.run_summary import RunSummary


def model_card(
    config: Any,
    summary: RunSummary,
    exported: Mapping[str, Any],
    generation: Mapping[str, Any],
    target_tags: Mapping[str, str],
) -> str:
    """README.md for an export of the run `summary` describes, trained with `config` (its
    stored config). `exported`: the checkpoint's path, update and weights and the parameter
    count; `generation`: the generation settings written; `target_tags`: for a multilingual
    run, each target language's tag."""
    plain = to_plain(config)
    data = plain.get("data", {})
    languages = sorted({data.get("src"), data.get("tgt")} | set(target_tags) - {None})
    sections = [
        _front_matter(languages, summary),
        _title(data, target_tags, str(exported.get("architecture", "PegasusForConditionalGeneration"))),
        _use(generation, target_tags),
        _data(plain, summary),
        _model(config, exported),
        _training(summary, exported),
        _evaluation(summary, exported),
        "## Configuration\n\nThe run's stored config (`config.yaml` of the run):\n\n```yaml\n"
        + OmegaConf.to_yaml(OmegaConf.create(plain)).rstrip()
        + "\n```\n",
    ]
    return str(portable("\n".join(sections)))  # the card is published: no path of this machine


def _front_matter(languages: list[str], summary: RunSummary) -> str:
    results = []
    for name, report in summary.evals.items():
        metrics = [
            {
                "type": key,
                "name": metric["name"],
                "value": round(float(metric["score"]), 2),
                "args": metric["signature"],
            }
            for key, metric in report.get("metrics", {}).items()
        ]
        pair = report.get("language_pair", "")
        results.append(
            {
                "task": {"type": "translation", "name": f"Translation {pair}"},
                "dataset": {
                    "name": f"{report.get('split_name', name)} ({name})",
                    "type": str(report.get("split_name")),
                },
                "metrics": metrics,
            }
        )
    meta: dict[str, Any] = {
        "language": languages,
        "library_name": "transformers",
        "tags": ["translation", "mtrain"],
    }
    if results:
        meta["model-index"] = [{"name": summary.name, "results": results}]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def _title(data: Mapping[str, Any], target_tags: Mapping[str, str], architecture: str) -> str:
    direction = f"{data.get('src')}→{data.get('tgt')}"
    if target_tags:
        direction = "multilingual (into " + ", ".join(target_tags) + ")"
    if architecture == "MarianMTModel":  # a fine-tune of an imported OPUS-MT model (hf_marian.py)
        loads = (
            "transformers' `MarianMTModel`, the architecture of the model it was fine-tuned from, with "
            "that model's `MarianTokenizer` files unchanged.\n"
        )
    else:
        loads = (
            "transformers' `PegasusForConditionalGeneration`, whose Pre-LN encoder-decoder computes "
            "what mtrain's model computes (no custom code), and its tokenizer is the run's "
            "SentencePiece model restated for the `tokenizers` library.\n"
        )
    return (
        f"# {data.get('name')} {direction}: a Transformer trained with mtrain\n\n"
        "Trained with `mtrain fit` and exported with `mtrain export format=hf`. It loads as " + loads
    )


def _use(generation: Mapping[str, Any], target_tags: Mapping[str, str]) -> str:
    a, b = generation["mtrain_max_len_a"], generation["mtrain_max_len_b"]
    prefix = f'"{next(iter(target_tags.values()))} " + ' if target_tags else ""
    lines = [
        "## Use\n",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("THIS_DIRECTORY")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("THIS_DIRECTORY")',
        f'inputs = tokenizer({prefix}"SOURCE SENTENCE", return_tensors="pt")',
        "# mtrain's length limit for this source: max_len_a * source ids (eos included) + max_len_b",
        f"limit = int({a} * inputs.input_ids.shape[1] + {b})",
        "output = model.generate(**inputs, max_new_tokens=limit)",
        "print(tokenizer.decode(output[0], skip_special_tokens=True))",
        "```\n",
        'transformers 5 has no translation pipeline (`pipeline("translation")` raises KeyError): '
        "call `generate` as above.\n",
    ]
    if target_tags:
        tags = ", ".join(f"`{tag}` ({lang})" for lang, tag in target_tags.items())
        lines.append(
            f"The target language is chosen by its tag at the start of the source text: {tags}. "
            "The tag is a special token of the tokenizer; the model never outputs one.\n"
        )
    early = generation["early_stopping"]
    lines.append(
        f"`generation_config.json` decodes as the run's test set was decoded: beam {generation['num_beams']}, "
        f"length penalty {generation['length_penalty']} (score / output length incl. EOS ** alpha), "
        f"early_stopping={early!r}, at least {generation['min_new_tokens']} token(s) before EOS, pad and bos "
        "(and a multilingual run's tags) suppressed. mtrain limits each translation to "
        f"{a} x source length + {b} tokens and then forces EOS; transformers has one limit per batch "
        f"(`max_new_tokens`), and the config's ({generation['max_new_tokens']}) is only the "
        "position table's. Pass `max_new_tokens` as above; translations that reach the limit can "
        "differ from mtrain's, others are mtrain's but for near-ties (docs/EXPORT.md in mtrain).\n"
    )
    return "\n".join(lines)


def _data(plain: Mapping[str, Any], summary: RunSummary) -> str:
    data, tokenizer = plain.get("data", {}), plain.get("tokenizer", {})
    recorded = summary.metrics.get("data", {})
    lines = ["## Data\n"]
    corpora = recorded.get("corpora") or []
    if corpora:
        lines.append("| corpus | direction | tag | weight | pairs kept | source tokens | target tokens |")
        lines.append("|---|---|---|---|---|---|---|")
        for corpus in corpora:
            train = corpus.get("train", {})
            lines.append(
                f"| {corpus.get('name')} | {corpus.get('src')}-{corpus.get('tgt')} | {corpus.get('tag') or ''} | "
                f"{corpus.get('weight')} | {_count(train.get('kept'))} | {_count(train.get('src_tokens'))} | "
                f"{_count(train.get('tgt_tokens'))} |"
            )
        lines.append("")
    else:
        lines.append(f"Corpus: {data.get('name')} ({data.get('src')}-{data.get('tgt')}); metrics.json has no counts.\n")
    splits = data.get("splits", {})
    lines.append(
        f"Validation split `{splits.get('valid')}`, test split `{splits.get('test')}`"
        f"{'; training pairs limited to ' + str(data.get('train_limit')) if data.get('train_limit') else ''}. "
        f"Tokenizer: SentencePiece {tokenizer.get('model_type')}, {tokenizer.get('vocab_size')} pieces, "
        f"{'joint' if tokenizer.get('joint', True) else 'separate'} vocabulary.\n"
    )
    return "\n".join(lines)


def _model(config: Any, exported: Mapping[str, Any]) -> str:
    model = resolved_model(config.model)
    return (
        "## Model\n\n"
        f"{model.encoder_layers}+{model.decoder_layers} layers, d_model {model.d_model}, {model.heads} heads, "
        f"feed-forward {model.ffn_dim} ({model.activation}), {model.norm_position}-norm {model.norm_type} with "
        f"a final norm, {model.positions} positions (up to {model.max_positions}), embeddings "
        f"{'scaled by sqrt(d_model)' if model.scale_embeddings else 'unscaled'} and "
        f"{'tied' if model.tie_embeddings else 'untied'}, output vocabulary {model.output_vocab}: "
        f"{exported['parameters']:,} parameters.\n"
    )


def _training(summary: RunSummary, exported: Mapping[str, Any]) -> str:
    metrics = summary.metrics
    overrides = " ".join(f"{key}={value}" for key, value in summary.overrides.items())
    lines = [
        "## Training\n",
        f"Command: `mtrain fit {overrides}`".rstrip() + "\n",
        f"- {metrics.get('updates', '?')} updates, {metrics.get('epochs', '?')} epoch(s), "
        f"{metrics.get('train_time_s', '?')} s of training on {metrics.get('device', '?')} "
        f"({metrics.get('precision', '?')}); stopped: {metrics.get('stop_reason', '?')} (metrics.json)",
        f"- exported: {exported['checkpoint']} (update {exported['update']}, {exported['weights']} weights), "
        f"with mtrain {__version__}",
    ]
    if isinstance(metrics.get("updates"), int) and metrics["updates"] < exported["update"]:
        lines.append(
            f"- metrics.json was written at update {metrics['updates']}: the run went on after it "
            "(a resume that did not finish) and its figures above are that earlier record's"
        )
    valid = metrics.get("valid") or {}
    if "best_bleu" in valid:
        lines.append(f"- best validation BLEU {valid['best_bleu']:.2f} at update {valid.get('best_update')}")
    return "\n".join(lines) + "\n"


def _evaluation(summary: RunSummary, exported: Mapping[str, Any]) -> str:
    if not summary.evals:
        return "## Evaluation\n\nThe run has no evaluation reports (eval/*.json).\n"
    lines = [
        "## Evaluation\n",
        "Scored by mtrain's own decoding (engine and precision as listed); transformers decodes "
        "in float32, which gives mtrain's float32 translations (`mtrain translate precision=fp32`: "
        "mtrain's default on a CPU with bf16 support is bf16, whose translations can differ).\n",
        "| report | split | pair | sentences | checkpoint | decoding | metric | score | signature |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, report in summary.evals.items():
        checkpoint = report.get("checkpoint", {})
        decode = report.get("decode", {})
        decoding = (
            f"beam {decode.get('beam')}, alpha {decode.get('length_penalty')}, "
            f"{decode.get('engine')} {decode.get('precision')}"
        )
        where = f"{checkpoint.get('which', '?')} (update {checkpoint.get('update', '?')})"
        if (checkpoint.get("update"), checkpoint.get("weights", "raw")) != (exported["update"], exported["weights"]):
            where += ", not the exported weights"
        for metric in report.get("metrics", {}).values():
            lines.append(
                f"| {name} | {report.get('split_name')} | {report.get('language_pair')} | {report.get('sentences')} "
                f"| {where} | {decoding} | {metric['name']} | {float(metric['score']):.2f} | `{metric['signature']}` |"
            )
    return "\n".join(lines) + "\n"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"
