"""A run is never damaged: one writer at a time, refusals write nothing, resume checks its data,
checkpoints never alias other than best.pt sharing its update_N.pt's file (written anew by rename);
no command destroys what it reads (issue 40: translate's input, a run exported or averaged over).

Each refusal goes through the `mtrain` command, as a user meets it, and is checked against a
hash of every file of the run directory (train.log and the lock included) before and after.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from mtrain.checkpoint.files import load_checkpoint
from mtrain.cli.evaluate import score_hypotheses
from mtrain.cli.fit import run_fit
from mtrain.cli.translate import run_translate
from mtrain.config import EvalConfig, TranslateConfig
from mtrain.errors import MtrainError
from mtrain.evaluate.average import average_to_file, last_checkpoints
from mtrain.evaluate.metrics import read_lines
from mtrain.evaluate.scoring import check_references, translate_and_score
from mtrain.export import export_run
from mtrain.rundir import RunDir
from tests.fit_runs import (
    TINY,
    assert_refused,
    compose_fit,
    mtrain,
    one_error_line,
    run_check,
    snapshot,
    start_fit,
    wait_for,
)

# No test decode (data.splits.test=null): these runs check locks, resumes and refusals.
FAST = [
    *TINY,
    "train.valid_bleu=false",
    "data.train_limit=300",
    "train.log_every=1",
    "decode.beam=1",
    "data.splits.test=null",
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, multi30k_slice):
    """A run of 4 updates (checkpoints at 2 and 4); tests copy it before touching it."""
    base = tmp_path_factory.mktemp("finished")
    common = [
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={base / 'cache'}",
        *FAST,
        "train.max_updates=4",
        "train.validate_every=2",
    ]
    result = mtrain("fit", *common, f"hydra.run.dir={base / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    return common, base / "run"


@pytest.fixture
def run_copy(tmp_path, finished_run):
    common, run_dir = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return common, copy


def wait_until_held(run_dir: Path, process) -> None:
    """Until `process` holds the run's lock (its pid is in the lock file)."""
    lock = RunDir(run_dir).lock_file
    wait_for(lock, process)
    deadline = time.time() + 60
    while not lock.read_text().strip():
        assert time.time() < deadline
        time.sleep(0.01)


def refused_while_held(first, run_dir: Path, *second_args: str):
    """Run `mtrain *second_args` while `first` holds `run_dir`, stopped (SIGSTOP) so that it
    holds it throughout; returns the second's result and the run's hashes before and after."""
    wait_until_held(run_dir, first)
    first.send_signal(signal.SIGSTOP)
    try:
        before = snapshot(run_dir)
        second = mtrain(*second_args)
        after = snapshot(run_dir)
    finally:
        first.send_signal(signal.SIGCONT)
    return second, before, after


def model_tensors(run_dir: Path) -> dict:
    run = RunDir(run_dir)
    return {
        path.name: load_checkpoint(path)["model"]
        for path in [run.checkpoint("last"), run.checkpoint("best"), *run.update_checkpoints()]
    }


def test_two_fits_in_one_run_directory_one_is_refused_the_other_runs_as_alone(tmp_path, finished_run):
    common, alone = finished_run
    run_dir = tmp_path / "run"
    first = start_fit([*common, f"hydra.run.dir={run_dir}"])
    second, before, after = refused_while_held(first, run_dir, "fit", *common, f"hydra.run.dir={run_dir}")
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    assert second.returncode == 2
    assert one_error_line(second).startswith(
        f"mtrain: error: {run_dir} is in use by process {first.pid} on this machine"
    )
    assert after == before  # the refused one wrote nothing, not even to train.log
    ours, lone = model_tensors(run_dir), model_tensors(alone)
    assert ours.keys() == lone.keys() == {"last.pt", "best.pt", "update_2.pt", "update_4.pt"}
    assert all(torch.equal(ours[name][key], lone[name][key]) for name in lone for key in lone[name])
    assert not RunDir(run_dir).lock_file.exists()  # let go at the end


def test_two_resumes_of_one_run_one_is_refused_a_reader_is_not(run_copy, tmp_path):
    common, run_dir = run_copy
    resume = [*common, "train.max_updates=6", "train.resume=true", f"hydra.run.dir={run_dir}"]
    first = start_fit(resume)
    (tmp_path / "in.de").write_text("ein Hund läuft\n", encoding="utf-8")
    second, before, after = refused_while_held(first, run_dir, "fit", *resume)
    first.send_signal(signal.SIGSTOP)
    try:  # translate (and eval) take no lock: they read a run while it trains
        translated = mtrain("translate", f"run={run_dir}", f"input={tmp_path / 'in.de'}", "device=cpu")
    finally:
        first.send_signal(signal.SIGCONT)
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0 and load_checkpoint(RunDir(run_dir).checkpoint("last"))["update"] == 6, stderr
    assert second.returncode == 2 and f"is in use by process {first.pid}" in one_error_line(second)
    assert after == before
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr[-3000:]


@pytest.mark.slow
def test_a_resume_after_a_sigkill_is_not_blocked(tmp_path, finished_run):
    common, _ = finished_run
    run_dir = tmp_path / "run"
    # 40 updates: the kill comes at the first checkpoint (update 2), with 38 updates of margin
    # before the run would end and let go of its lock on its own.
    settings = [*common, "train.max_updates=40", "data.splits.test=null", f"hydra.run.dir={run_dir}"]
    process = start_fit(settings)
    wait_for(RunDir(run_dir).checkpoint("last"), process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert RunDir(run_dir).lock_file.exists()  # the kill left the file, not the lock
    result = mtrain("fit", *settings, "train.resume=true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert load_checkpoint(RunDir(run_dir).checkpoint("last"))["update"] == 40


def test_refused_fresh_start_leaves_the_run_byte_identical(run_copy):
    common, run_dir = run_copy
    before = snapshot(run_dir)
    result = mtrain("fit", *common, "train.max_updates=6", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("mtrain: error:")]
    assert len(errors) == 1 and "already has checkpoints" in errors[0] and "Traceback" not in result.stderr
    assert snapshot(run_dir) == before  # .hydra/ included: the refused overrides are not recorded


def test_refused_resume_with_another_vocabulary_size_leaves_the_run_byte_identical(run_copy):
    common, run_dir = run_copy
    before = snapshot(run_dir)
    result = mtrain("fit", *common, "tokenizer.vocab_size=500", "train.resume=true", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2 and "tokenizer.vocab_size=600" in result.stderr, result.stderr[-2000:]
    assert snapshot(run_dir) == before


def test_resume_on_another_corpus_is_refused_naming_the_data(run_copy, multi30k_slice, tmp_path):
    common, run_dir = run_copy
    other = tmp_path / "other_corpus"
    shutil.copytree(multi30k_slice, other)
    train_de = other / "train.de"
    train_de.write_text(
        "".join(reversed(train_de.read_text(encoding="utf-8").splitlines(keepends=True))), encoding="utf-8"
    )
    before = snapshot(run_dir)
    overrides = [o for o in common if not o.startswith("data.local_dir=")]
    result = mtrain(
        "fit",
        *overrides,
        f"data.local_dir={other}",
        "train.max_updates=6",
        "train.resume=true",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2
    assert "differs from the one this checkpoint was trained on" in one_error_line(result)
    assert "tokenizer:" in result.stdout  # the console shows the refused attempt's work...
    assert snapshot(run_dir) == before  # ...the run's train.log does not; the tokenizer was not retrained


def test_resume_on_a_filtered_corpus_is_refused(run_copy):
    common, run_dir = run_copy
    before = snapshot(run_dir)
    overrides = [o for o in common if not o.startswith("data.train_limit=")]
    result = mtrain(
        "fit",
        *overrides,
        "data.train_limit=200",
        "train.max_updates=6",
        "train.resume=true",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2
    assert "differs from the one this checkpoint was trained on" in one_error_line(result)
    assert snapshot(run_dir) == before


def test_resuming_a_finished_run_changes_nothing(run_copy):
    common, run_dir = run_copy
    before = snapshot(run_dir)
    result = mtrain("fit", *common, "train.resume=true", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "this run has finished" in result.stdout
    assert snapshot(run_dir) == before  # not a line more in train.log


def test_a_fit_refused_for_a_missing_split_leaves_no_directory(tmp_path, multi30k_slice):
    run_dir = tmp_path / "run"
    result = mtrain(
        "fit",
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *FAST,
        "data.splits.test=test_2099",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 2 and "test_2099" in one_error_line(result)
    assert not run_dir.exists()  # the directory Hydra made for it is removed again, while empty


def test_best_pt_is_its_update_checkpoint_stored_once(finished_run):
    """`mtrain fit` links best.pt to the update_N.pt it equals (one file, two names), never to
    last.pt, and metrics.json counts the file once."""
    import json

    run = RunDir(finished_run[1])
    best = run.checkpoint("best")
    same = run.update_checkpoint(load_checkpoint(best)["update"])
    assert best.stat().st_ino == same.stat().st_ino and best.stat().st_nlink == 2
    assert run.checkpoint("last").stat().st_nlink == 1
    files = {(p.stat().st_ino, p.stat().st_size) for p in run.checkpoint_dir.iterdir()}
    use = json.loads(run.metrics_file.read_text(encoding="utf-8"))["disk_use_mb"]
    assert use["checkpoints"] == pytest.approx(sum(size for _, size in files) / 1e6, abs=0.1)


def test_checkpoints_are_separate_files_and_resume_from_picks_one(run_copy, caplog):
    common, run_dir = run_copy
    caplog.set_level(logging.INFO, logger="mtrain")
    run = RunDir(run_dir)
    last, update_4 = run.checkpoint("last"), run.update_checkpoint(4)
    assert os.stat(last).st_ino != os.stat(update_4).st_ino and os.stat(last).st_nlink == 1
    update_2 = run.update_checkpoint(2).read_bytes()
    shutil.copyfile(run.update_checkpoint(2), last)  # what a user might do by hand
    assert load_checkpoint(update_4)["update"] == 4  # never aliased: update_4.pt is untouched
    shutil.copyfile(update_4, last)
    (run.checkpoint_dir / ".last.pt.x1y2.tmp").write_bytes(b"half a checkpoint")  # an interrupted write

    metrics = run_fit(
        compose_fit([*common, "train.max_updates=6", "train.resume=true", "train.resume_from=update_2"]), run_dir
    )
    assert "resumed at update 2" in caplog.text and metrics["updates"] == 6
    # update_N.pt holds the weights only: a warm start, and the log says it is not exact
    assert "holds the weights only (no optimiser state)" in caplog.text
    assert "the learning rate of update" not in caplog.text  # a larger update budget: inverse-sqrt unchanged
    assert not list(run.checkpoint_dir.glob(".*.tmp"))
    assert run.update_checkpoint(2).read_bytes() == update_2 or not run.update_checkpoint(2).exists()


def test_a_resume_that_moves_the_learning_rate_warns_with_both_values(run_copy, caplog):
    """The finished 4-update run (inverse-sqrt, warmup 20, lr 3e-3) resumed under a linear
    decay to update 6: update 5 gets 3e-3 * 1/6 = 5.0e-04 where the checkpoint's schedule
    gives 3e-3 * 5/20 = 7.5e-04."""
    common, run_dir = run_copy
    caplog.set_level(logging.INFO, logger="mtrain")
    run_fit(compose_fit([*common, "train.max_updates=6", "train.scheduler=linear", "train.resume=true"]), run_dir)
    assert (
        "the learning rate of update 5 is 5.0e-04 under the current train.* settings (scheduler=linear, "
        "max_updates=6, max_time=None) where the checkpoint's (scheduler=inverse_sqrt, max_updates=4, "
        "max_time=None) give 7.5e-04"
    ) in caplog.text


def test_save_every_checkpoints_without_validation(tmp_path, multi30k_slice):
    common = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}", *FAST]
    run_fit(
        compose_fit(
            [
                *common,
                "train.max_updates=3",
                "train.validate_every=1000",
                "train.save_every=0.001s",
                "train.keep_last=5",
            ]
        ),
        tmp_path / "run",
    )
    run = RunDir(tmp_path / "run")
    assert [p.name for p in run.update_checkpoints()] == ["update_1.pt", "update_2.pt", "update_3.pt"]
    assert load_checkpoint(run.checkpoint("best"))["update"] == 3  # only the final validation competes


def test_eval_reads_a_lone_cr_as_a_space_not_a_line_break(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_bytes(b"a dog\rruns\r\nthe cat sleeps\n")
    ref.write_bytes(b"a dog runs\nthe cat\rsleeps\n")
    assert read_lines(hyp) == ["a dog runs", "the cat sleeps"] == read_lines(ref)


def test_blank_references_are_refused():
    with pytest.raises(MtrainError, match="blank on every line"):
        check_references([["", "  ", "\t"]], "data.splits.valid=val")
    with pytest.raises(MtrainError, match="empty"):
        translate_and_score(lambda sources: sources, [], [[]], "ref=x")
    scored = translate_and_score(list, ["a b c d"], [["a b c d"]], "ref=x")
    assert scored.scores["bleu"]["score"] == pytest.approx(100.0)


def test_kill_during_a_checkpoint_write_keeps_last_intact(tmp_path, multi30k_slice, monkeypatch):
    """A write that dies half-way (the temporary file is never renamed) leaves last.pt as it was."""
    common = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}", *FAST]
    real_save = torch.save
    calls = {"n": 0}

    def dies_on_third_write(obj, handle, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # update_4.pt: the second checkpoint
            handle.write(b"partial")
            raise KeyboardInterrupt  # as a kill would stop it, not an OSError
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dies_on_third_write)
    with pytest.raises(KeyboardInterrupt):
        run_fit(compose_fit([*common, "train.max_updates=4", "train.validate_every=2"]), tmp_path / "run")
    run = RunDir(tmp_path / "run")
    assert load_checkpoint(run.checkpoint("last"))["update"] == 2
    assert not list(run.checkpoint_dir.glob(".*.tmp"))  # atomic_write removed its temporary file


def test_validate_every_time_validates_on_the_training_clock(tmp_path, multi30k_slice):
    from tests.fit_runs import scalars

    common = [f"data.local_dir={multi30k_slice}", f"data.cache_dir={tmp_path / 'cache'}", *FAST]
    run_fit(
        compose_fit([*common, "train.max_updates=3", "train.validate_every=1000", "train.validate_every_time=0.001s"]),
        tmp_path / "run",
    )
    assert sorted(scalars(tmp_path / "run", "valid/loss")) == [1, 2, 3]  # by time, not by the update count


# ----------------------------------------------------------------------------- issue 40
# Each refusal through the `mtrain` command, with every file it could reach hashed before and
# after; its variants in process, through the function the command runs first.
def test_a_refused_init_from_leaves_no_run_directory(tmp_path, multi30k_slice):
    parent = tmp_path / "parent.pt"
    parent.write_bytes(b"PK\x03\x04 the first bytes of a checkpoint")  # a truncated copy
    result = mtrain(
        "fit",
        f"data.local_dir={multi30k_slice}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *FAST,
        f"init_from={parent}",
        f"hydra.run.dir={tmp_path / 'runs' / 'child'}",
    )
    assert result.returncode == 2 and one_error_line(result).startswith(f"mtrain: error: init_from={parent}: ")
    assert not (tmp_path / "runs").exists()  # the run directory and the parent Hydra made for it


def test_a_run_given_where_a_sweep_is_expected_is_a_table_of_that_run(run_copy):
    _, run_dir = run_copy
    compared = mtrain("eval", f"runs={run_dir}")
    reported = mtrain("report", str(run_dir), "bootstrap_samples=0")
    for result in (compared, reported):
        assert result.returncode == 0, result.stderr[-3000:]
        table = result.stdout.splitlines()
        assert table[2].split()[0] == run_dir.name and ".hydra" not in result.stdout, result.stdout
    assert ".hydra" not in (run_dir / "report" / "report.md").read_text(encoding="utf-8")


def test_translate_never_writes_over_what_it_reads(run_copy, tmp_path):
    _, run_dir = run_copy
    source = tmp_path / "in.de"
    source.write_text("ein Hund läuft\n", encoding="utf-8")
    before = snapshot(tmp_path)  # the input and the run
    result = mtrain("translate", f"run={run_dir}", f"input={source}", f"output={source}", "device=cpu")
    assert result.returncode == 2
    assert one_error_line(result) == (
        f"mtrain: error: output={source} would replace input={source}; write it elsewhere (nothing was written)"
    )
    assert snapshot(tmp_path) == before  # no translation, no provenance record beside it

    (tmp_path / "link.de").symlink_to(source)
    os.link(source, tmp_path / "hard.de")
    (tmp_path / "in.de.mtrain.json").write_text("{}", encoding="utf-8")
    other_run = tmp_path / "other"
    shutil.copytree(run_dir / "checkpoints", other_run / "checkpoints")
    shutil.copyfile(run_dir / "config.yaml", other_run / "config.yaml")
    before = snapshot(tmp_path)
    for input_file, output, replaced in (
        (source, tmp_path / "link.de", f"input={source} (the same file by another name)"),
        (source, tmp_path / "hard.de", f"input={source} (the same file by another name)"),
        (source, run_dir / "checkpoints" / "best.pt", f"a file of run={run_dir}"),
        (source, other_run / "config.yaml", f"a file of the run directory {other_run}"),
        (tmp_path / "in.de.mtrain.json", tmp_path / "in.de", f"input={tmp_path / 'in.de.mtrain.json'}"),
    ):
        with pytest.raises(MtrainError) as error:
            run_translate(TranslateConfig(run=str(run_dir), input=str(input_file), output=str(output)))
        assert str(error.value).startswith(f"output={output}") and f" would replace {replaced}; " in str(error.value)
    assert snapshot(tmp_path) == before


def test_an_ensemble_without_run_says_how_it_is_written(tmp_path):
    result = mtrain("translate", f"ensemble=[{tmp_path / 'a'},{tmp_path / 'b'}]", "input=x.de")
    assert result.returncode == 2
    assert one_error_line(result) == (
        "mtrain: error: ensemble: decodes with run= (its tokenizer) and the members, and run= is missing: an "
        f"ensemble is written run=A ensemble=[B,...], here run={tmp_path / 'a'} ensemble=[{tmp_path / 'b'}]"
    )


def test_eval_never_scores_a_file_against_itself_nor_writes_over_a_reference(tmp_path):
    hyp, ref = tmp_path / "out.en", tmp_path / "out.en.sentences.tsv"  # a reference where the TSV goes
    hyp.write_text("a dog runs\n", encoding="utf-8")
    ref.write_text("a dog runs fast\n", encoding="utf-8")
    with pytest.raises(MtrainError, match=rf"^ref={re.escape(str(hyp))}: is the hyp= file itself"):
        score_hypotheses(EvalConfig(hyp=str(hyp), ref=[str(hyp)]), log=lambda _: None)
    with pytest.raises(MtrainError, match=rf"^the sentence scores {re.escape(str(ref))} would replace ref="):
        score_hypotheses(EvalConfig(hyp=str(hyp), ref=[str(ref)], per_sentence=True), log=lambda _: None)
    assert ref.read_text(encoding="utf-8") == "a dog runs fast\n"


def test_export_replaces_a_previous_export_and_nothing_else(run_copy, tmp_path):
    _, run_dir = run_copy
    before, run_before = snapshot(tmp_path), snapshot(run_dir)
    result = mtrain("export", f"run={run_dir}", f"out={run_dir}", "force=true")
    assert result.returncode == 2
    assert one_error_line(result).startswith(f"mtrain: error: out={run_dir}: is run={run_dir} itself; ")
    for out, reason in (
        (tmp_path, f"holds run={run_dir}"),  # the run's parent
        (run_dir / "checkpoints", "is not a directory `mtrain export` wrote"),
        (run_dir / "config.yaml", "is a file"),
    ):
        with pytest.raises(MtrainError, match=rf"^out={re.escape(str(out))}: {re.escape(reason)}; .* whatever force"):
            export_run(run_dir, out, force=True)
    assert snapshot(tmp_path) == before

    exported = tmp_path / "exports" / "ct2"
    export_run(run_dir, exported)
    with pytest.raises(MtrainError, match="already exists; choose another directory or pass force=true"):
        export_run(run_dir, exported)
    export_run(run_dir, exported, force=True)  # what force is for
    shutil.copyfile(run_dir / "checkpoints" / "best.pt", exported / "best.pt")
    with pytest.raises(MtrainError, match=r": holds best.pt, which `mtrain export` did not write; "):
        export_run(run_dir, exported, force=True)
    assert (exported / "best.pt").is_file() and snapshot(run_dir) == run_before


def test_average_never_replaces_a_run_checkpoint_and_a_weights_only_file_is_not_resumed(run_copy, tmp_path, capsys):
    common, run_dir = run_copy
    run = RunDir(run_dir)
    before = snapshot(run_dir)
    result = mtrain("average", f"run={run_dir}", "last=2", f"out={run.checkpoint('last')}", "force=true")
    assert result.returncode == 2
    assert one_error_line(result).startswith(
        f"mtrain: error: out={run.checkpoint('last')}: is last.pt of the run {run_dir}, which training writes"
    )
    assert snapshot(run_dir) == before

    mine = tmp_path / "mine.pt"
    mine.write_bytes(b"not to be lost")
    (tmp_path / "best_link.pt").symlink_to(run.checkpoint("best"))
    for out, refusal in (
        (mine, f"out={mine}: already exists; pass force=true"),
        (tmp_path / "best_link.pt", f"out={tmp_path / 'best_link.pt'}: is best.pt of the run {run_dir}"),
        (run.update_checkpoint(2), f"out={run.update_checkpoint(2)}: is update_2.pt of the run"),
    ):
        assert_refused(*run_check("average", [f"run={run_dir}", "last=2", f"out={out}"], capsys), refusal)
    assert run_check("average", [f"run={run_dir}", "last=2", f"out={mine}", "force=true"], capsys) == (0, [])

    # last.pt replaced by an average (as `average out=last.pt` did before it was refused)
    average_to_file(last_checkpoints(run_dir, 2), tmp_path / "average.pt")
    shutil.copyfile(tmp_path / "average.pt", run.checkpoint("last"))
    before = snapshot(run_dir)
    result = mtrain("fit", *common, "train.max_updates=6", "train.resume=true", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2
    assert one_error_line(result).startswith(
        f"mtrain: error: {run.checkpoint('last')}: holds weights only (an average of 2 checkpoints), "
        "not a point of training to resume"
    )
    assert snapshot(run_dir) == before


def test_a_first_run_of_matplotlib_writes_nothing_into_the_report_table(run_copy, tmp_path):
    # With no font cache, matplotlib logs "generated new fontManager" at INFO; report and eval log
    # INFO to stdout, so that line once landed above the table (a fresh machine's first report).
    _, run_dir = run_copy
    fresh = {"MPLCONFIGDIR": str(tmp_path / "no-font-cache")}
    reported = mtrain("report", str(run_dir), "bootstrap_samples=0", env=fresh)
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert "fontManager" not in reported.stdout + reported.stderr
    assert reported.stdout.splitlines()[2].split()[0] == run_dir.name, reported.stdout
