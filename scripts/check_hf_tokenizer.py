"""Does format=hf's tokenizer encode and decode as SentencePiece? Every Multi30k sentence, checked.

    python scripts/check_hf_tokenizer.py runs/m30k/tokenizer/spm.model [other.model ...]

Each SentencePiece model (joint, mtrain's special ids) is converted as `mtrain export format=hf`
converts it (`mtrain.export.hf_tokenizer`), saved, loaded back with `AutoTokenizer`, and every
sentence of Multi30k's train, val, test_2016_flickr and test_2017_flickr files (de and en) is
encoded by both; the ids must be mtrain's `encode_src` + eos, and decoding mtrain's ids must
give `decode_tgt`'s text. Prints the count of sentences and of differences per model.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mtrain.export.hf_tokenizer import build_hf_tokenizer
from mtrain.tokenizer import Tokenizer

FILES = [
    f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr", "test_2017_flickr") for lang in ("de", "en")
]


def main() -> None:
    from transformers import AutoTokenizer

    corpus = Path(os.environ.get("MTRAIN_DATA_DIR", REPO_ROOT.parent / "shared" / "data")) / "multi30k"
    for model_file in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copyfile(model_file, Path(scratch) / "spm.model")
            tokenizer = Tokenizer.load(Path(scratch))
            build_hf_tokenizer(tokenizer, [], 1024).save_pretrained(Path(scratch) / "hf")
            hf_tokenizer = AutoTokenizer.from_pretrained(Path(scratch) / "hf")
        sentences = ids_differ = text_differs = 0
        for name in FILES:
            with gzip.open(corpus / f"{name}.gz", "rt", encoding="utf-8") as lines:
                batch = [line.rstrip("\n") for line in lines]
            for line, ids in zip(batch, hf_tokenizer(batch)["input_ids"], strict=True):
                expected = tokenizer.encode_src(line) + [tokenizer.eos_id]
                sentences += 1
                ids_differ += ids != expected
                text_differs += hf_tokenizer.decode(expected, skip_special_tokens=True) != tokenizer.decode_tgt(
                    expected
                )
        print(f"{model_file}: {sentences:,} sentences; ids differ on {ids_differ}, decoded text on {text_differs}")


if __name__ == "__main__":
    main()
