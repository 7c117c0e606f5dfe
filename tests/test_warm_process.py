"""tests.warm_process: a command forked from the warm process behaves as a new interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.warm_process import _warm_process_for, run_python, start_python

PROBE = """
import atexit, json, os, signal, sys
import torch
atexit.register(lambda: print("atexit ran", file=sys.stderr))
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "stdin": sys.stdin.read(), "parent": os.getppid(),
    "threads": torch.get_num_threads(), "flag": os.environ.get("MTRAIN_DATA_DIR"),
    "sigint": str(signal.getsignal(signal.SIGINT)), "main": __name__,
    "omp_cache": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
}))
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_command_gets_its_argv_cwd_stdin_environment_and_exit_status(tmp_path):
    import json

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MTRAIN_DATA_DIR": "/somewhere"}
    result = run_python("-c", PROBE, "3", cwd=tmp_path, env=env, input="typed\n", text=True)
    assert result.returncode == 3, result.stderr
    seen = json.loads(result.stdout)
    assert seen["argv"] == ["-c", "3"] and seen["cwd"] == str(tmp_path) and seen["stdin"] == "typed\n"
    forked = os.environ.get("MTRAIN_TEST_FRESH_PROCESSES") != "1"
    assert (seen["parent"] != os.getpid()) == forked  # forked by the warm process, not started by this one
    assert seen["threads"] == 1 and seen["flag"] == "/somewhere"
    assert seen["sigint"] == str(signal.default_int_handler) and seen["main"] == "__main__"
    assert seen["omp_cache"] == "16"  # set by importing mtrain (here and in the warm process)
    assert result.stderr == "atexit ran\n"  # the interpreter's end: atexit handlers, streams flushed


def test_a_crash_prints_its_traceback_and_exits_1(tmp_path):
    result = run_python("-c", "raise ValueError('boom')", cwd=tmp_path, text=True)
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert result.stderr.splitlines()[-1] == "ValueError: boom"


def test_signals_reach_the_command_and_a_timeout_kills_it(tmp_path):
    process = start_python("-c", "import time; print('up', flush=True); time.sleep(60)", cwd=tmp_path, text=True)
    time.sleep(0.5)
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("-c", "import time; time.sleep(60)", cwd=tmp_path, timeout=1)


def test_variables_read_while_importing_or_asked_for_start_a_new_interpreter():
    assert _warm_process_for({**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}, new_interpreter=False) is None
    assert _warm_process_for(dict(os.environ), new_interpreter=True) is None
    assert _warm_process_for({**os.environ, "PYTHONPATH": "/not/on/its/path"}, new_interpreter=False) is None
    for env, new in (({**os.environ, "X_NEW": "1"}, False), (dict(os.environ), True)):
        result = run_python("-c", "import os; print(os.getppid())", env=env, new_interpreter=new)
        assert int(result.stdout) == os.getpid()  # started by this process, not forked by the warm one
