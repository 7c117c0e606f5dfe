"""mtrain.evaluate.average: the averaged checkpoint holds the exact mean of the parameters."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from mtrain.checkpoint.files import load_checkpoint, save_checkpoint
from mtrain.errors import MtrainError
from mtrain.evaluate.average import average_checkpoints, average_to_file, last_checkpoints


def fake_state(update: int, scale: float, dtype=torch.float32) -> dict:
    generator = torch.Generator().manual_seed(update)
    return {
        "model": {
            "encoder.weight": (scale * torch.randn(4, 3, generator=generator)).to(dtype),
            "decoder.bias": torch.full((3,), scale, dtype=dtype),
            "steps": torch.tensor(update, dtype=torch.int64),  # an integer buffer
        },
        "optimizer": {"state": {}, "param_groups": []},
        "rng": {"torch": torch.get_rng_state()},
        "update": update,
        "config": {"model": {"d_model": 4}},
        "mtrain_version": "0.1.0",
    }


@pytest.fixture
def run_dir(tmp_path):
    directory = tmp_path / "run"
    for update, scale in ((100, 1.0), (200, 3.0), (1000, -2.0)):
        save_checkpoint(directory / "checkpoints" / f"update_{update}.pt", fake_state(update, scale))
    save_checkpoint(directory / "checkpoints" / "last.pt", fake_state(1000, -2.0))
    return directory


def test_average_of_two_checkpoints_is_their_exact_mean(run_dir):
    paths = [run_dir / "checkpoints" / "update_100.pt", run_dir / "checkpoints" / "update_200.pt"]
    first, second = (load_checkpoint(path)["model"] for path in paths)
    averaged = average_checkpoints(paths)

    expected = ((first["encoder.weight"].double() + second["encoder.weight"].double()) / 2).float()
    assert torch.equal(averaged["model"]["encoder.weight"], expected)
    assert torch.equal(averaged["model"]["decoder.bias"], torch.full((3,), 2.0))
    assert averaged["model"]["encoder.weight"].dtype == torch.float32
    assert averaged["model"]["steps"].item() == (100 + 200) // 2  # integers: floor division (fairseq)
    # Metadata from the newest checkpoint; per-point training state dropped; sources listed.
    assert averaged["update"] == 200 and averaged["config"] == {"model": {"d_model": 4}}
    assert "optimizer" not in averaged and "rng" not in averaged
    assert averaged["averaged_from"] == [str(path) for path in paths]


def test_half_precision_parameters_keep_their_dtype(tmp_path):
    paths = []
    for update, scale in ((1, 0.5), (2, 1.5)):
        paths.append(tmp_path / f"update_{update}.pt")
        save_checkpoint(paths[-1], fake_state(update, scale, torch.bfloat16))
    averaged = average_checkpoints(paths)["model"]["decoder.bias"]
    assert averaged.dtype == torch.bfloat16
    assert torch.equal(averaged, torch.full((3,), 1.0, dtype=torch.bfloat16))


def test_last_checkpoints_sorts_by_update_number(run_dir):
    # update_1000 sorts before update_200 as a string; the newest two are 200 and 1000.
    assert [p.name for p in last_checkpoints(run_dir, 2)] == ["update_200.pt", "update_1000.pt"]


def test_written_checkpoint_loads_with_weights_only(run_dir, tmp_path):
    out = average_to_file(last_checkpoints(run_dir, 3), tmp_path / "avg.pt")
    state = torch.load(out, weights_only=True)
    assert torch.equal(state["model"]["decoder.bias"], torch.full((3,), (1.0 + 3.0 - 2.0) / 3))
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left no temporary file


def test_bad_inputs(run_dir, tmp_path):
    only_two = tmp_path / "two"
    for update in (1, 2):
        save_checkpoint(only_two / "checkpoints" / f"update_{update}.pt", fake_state(update, 1.0))
    with pytest.raises(MtrainError, match=r"3 checkpoints asked for but only 2.*keep_last>=3"):
        last_checkpoints(only_two, 3)
    empty = tmp_path / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(MtrainError, match=r"no update_<N>\.pt checkpoints"):
        last_checkpoints(empty, 2)
    with pytest.raises(MtrainError, match="no such run directory"):
        last_checkpoints(tmp_path / "missing", 2)
    other = fake_state(5, 1.0)
    other["model"]["extra.weight"] = torch.zeros(2)
    save_checkpoint(tmp_path / "other.pt", other)
    with pytest.raises(MtrainError, match=r"parameters differ.*extra\.weight"):
        average_checkpoints([run_dir / "checkpoints" / "update_100.pt", tmp_path / "other.pt"])
    with pytest.raises(MtrainError, match="is one of the checkpoints"):
        average_to_file([run_dir / "checkpoints" / "update_100.pt"], run_dir / "checkpoints" / "update_100.pt")


def test_average_app(run_dir, monkeypatch, capsys):
    from mtrain.cli import main as cli

    monkeypatch.chdir(run_dir)
    monkeypatch.setattr(sys, "argv", ["mtrain", "average", f"run={run_dir}", "last=2"])
    cli.main()
    out = run_dir / "checkpoints" / "average_last2.pt"
    assert str(out) in capsys.readouterr().out
    expected = (torch.full((3,), 3.0) + torch.full((3,), -2.0)) / 2
    assert torch.equal(load_checkpoint(out)["model"]["decoder.bias"], expected)
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints"]  # nothing else written

    monkeypatch.setattr(sys, "argv", ["mtrain", "average", f"run={run_dir}", "last=9"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "9 checkpoints asked for" in capsys.readouterr().err


def state_of_run(update: int, seed: int = 1, corpus: str = "corpus-a", tokenizer: str = "spm-a") -> dict:
    """A checkpoint as `mtrain fit` writes it: its config and the data it was trained on."""
    state = fake_state(update, 1.0)
    state["config"] = {"seed": seed, "model": {"d_model": 4}}
    state["data_fingerprints"] = {"corpus": corpus, "tokenizer": tokenizer}
    return state


def write_checkpoints(tmp_path, **states) -> list:
    paths = []
    for name, state in states.items():
        paths.append(tmp_path / name / "checkpoints" / f"update_{state['update']}.pt")
        save_checkpoint(paths[-1], state)
    return paths


def test_checkpoints_of_one_run_average_without_a_warning(tmp_path, caplog):
    paths = write_checkpoints(tmp_path, run=state_of_run(100))
    save_checkpoint(paths[0].with_name("update_200.pt"), state_of_run(200))
    with caplog.at_level(logging.WARNING, logger="mtrain"):
        average_checkpoints([paths[0], paths[0].with_name("update_200.pt")])
    assert not caplog.records


@pytest.mark.parametrize(
    "other, why",
    [
        (dict(seed=2), "seed 1 vs 2"),
        (dict(corpus="corpus-b"), "training data"),
    ],
)
def test_checkpoints_of_different_runs_average_with_a_warning_naming_them(tmp_path, caplog, other, why):
    paths = write_checkpoints(tmp_path, first_run=state_of_run(100), second_run=state_of_run(200, **other))
    with caplog.at_level(logging.WARNING, logger="mtrain"):
        averaged = average_checkpoints(paths)
    assert torch.equal(averaged["model"]["decoder.bias"], torch.full((3,), 1.0))  # still averaged
    [warning] = [record.getMessage() for record in caplog.records]
    assert "different runs" in warning and why in warning
    assert str(tmp_path / "first_run") in warning and str(tmp_path / "second_run") in warning


def test_checkpoints_with_different_tokenizers_are_refused(tmp_path, monkeypatch, capsys):
    from mtrain.cli import main as cli

    paths = write_checkpoints(tmp_path, first_run=state_of_run(100), second_run=state_of_run(200, tokenizer="spm-b"))
    with pytest.raises(
        MtrainError,
        match=r"second_run.*update_200\.pt: its tokenizer differs from "
        r".*first_run.*update_100\.pt's",
    ):
        average_checkpoints(paths)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys, "argv", ["mtrain", "average", f"checkpoints=[{paths[0]},{paths[1]}]", f"out={tmp_path / 'avg.pt'}"]
    )
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("mtrain: error:") and "tokenizer differs" in line
    assert not (tmp_path / "avg.pt").exists()


def test_mtrain_average_takes_as_many_checkpoints_as_fit_keeps():
    from mtrain.config import AverageConfig, TrainConfig

    assert AverageConfig().last == TrainConfig().keep_last == 3
