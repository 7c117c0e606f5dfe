"""`mtrain average run=RUN [last=3] [out=FILE]`: average the last N checkpoints of a run
(or `checkpoints=[a.pt,b.pt] out=FILE`) into a new checkpoint, as fairseq does."""

from __future__ import annotations

from pathlib import Path

from mtrain.cli.common import mtrain_app
from mtrain.config import AverageConfig
from mtrain.errors import MtrainError


def run_average(cfg: AverageConfig) -> Path:
    from mtrain.evaluate.average import average_to_file, default_average_path, last_checkpoints

    if cfg.checkpoints:
        paths = [Path(path) for path in cfg.checkpoints]
        if not cfg.out:
            raise MtrainError("checkpoints=[...] needs out=FILE for the averaged checkpoint")
        out = Path(cfg.out)
    elif cfg.run:
        paths = last_checkpoints(cfg.run, cfg.last)
        out = Path(cfg.out) if cfg.out else default_average_path(cfg.run, cfg.last)
    else:
        raise MtrainError("nothing to average: give run=RUN_DIR [last=N], or checkpoints=[A.pt,B.pt] out=FILE")
    average_to_file(paths, out)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {out}")
    return out


@mtrain_app("average")
def main(cfg: AverageConfig) -> None:
    run_average(cfg)


if __name__ == "__main__":
    main()
