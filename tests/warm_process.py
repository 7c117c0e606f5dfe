"""Run `python -m mtrain ...` (or a script) as a new process that starts warm.

A command's own work in these tests is small; starting its interpreter is not: importing torch,
torch._dynamo (which any optimizer's construction imports), Hydra and mtrain's modules costs
2-4 CPU-seconds per process, most of the suite's CPU time. So each pytest worker keeps one
*warm* Python (this module run as `python -m tests.warm_process`): it imports all that once,
runs nothing else, and forks a child per command. The child is a real process with its own
pid, exit status, stdin/stdout/stderr, working directory, environment and signals, and runs
the command as `python -m` does (runpy), so everything after the interpreter's start is the
command line a user runs. The warm process never runs a torch operation, so no thread pool
exists to be broken by the fork, and nothing of a test's in-process state (pytest's capture,
logging handlers, warning filters, Hydra's global state) reaches the child.

A command falls back to a new interpreter (`subprocess.run`) where a fork could differ from one:
an environment variable that is read while importing (anything not in RUNTIME_ENV_KEYS, such
as ATEN_CPU_CAPABILITY), or `MTRAIN_TEST_FRESH_PROCESSES=1` (every command a new interpreter).
Tests that check the interpreter's start itself (`--help` imports no torch, the console script,
signals sent to a running fit) use `subprocess` directly.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# Environment variables that are read when used, not when a module is imported: a command may
# set these differently from the warm process and still be forked.
RUNTIME_ENV_KEYS = frozenset(
    {
        "OMP_NUM_THREADS",  # applied in the child as torch.set_num_threads (torch reads it at start)
        "PYTHONUNBUFFERED",  # applied in the child's stdout/stderr
        "PYTHONPATH",  # checked: only entries already on the warm process's sys.path
        "HF_HUB_OFFLINE",  # read by huggingface_hub, which the warm process does not import
        "HYDRA_FULL_ERROR",
        "MTRAIN_DATA_DIR",
        "MTRAIN_CACHE",
        "PYTEST_CURRENT_TEST",
        "CUDA_VISIBLE_DEVICES",  # read when CUDA initialises, which the warm process never does
        "TORCHINDUCTOR_CACHE_DIR",  # read at a compile (torch writes its default here at the first)
    }
)


# What commands import, in the order a command imports it: mtrain first (it sets oneDNN's cache
# size before torch loads), torch._dynamo (every optimizer's first add_param_group imports it).
WARM_MODULES = (
    "mtrain",
    "mtrain.runtime",
    "torch",
    "torch._dynamo",
    "torch.utils.tensorboard",
    "sacrebleu",
    "sentencepiece",
    "mtrain.cli.average",
    "mtrain.cli.evaluate",
    "mtrain.cli.export",
    "mtrain.cli.fit",
    "mtrain.cli.prepare",
    "mtrain.cli.report",
    "mtrain.cli.translate",
    "mtrain.decode.text.stream",
    "mtrain.evaluate.scoring",
    "mtrain.train.trainer",
)


# ---------------------------------------------------------------------------- the warm process
def _warm_up() -> dict[str, str]:
    """Import WARM_MODULES; the environment variables those imports set, to set again in each
    child (whose environment is the command's)."""
    before = dict(os.environ)
    for module in WARM_MODULES:
        importlib.import_module(module)
    assert threading.active_count() == 1, "the warm process must not start threads (a fork keeps only one)"
    for module in ("huggingface_hub", "datasets", "transformers"):  # they read HF_* while importing
        assert module not in sys.modules, f"the warm process imported {module}"
    return {key: value for key, value in os.environ.items() if before.get(key) != value}


def _serve() -> None:
    """Answer each request (a JSON line on stdin) with `start PID` once its child is forked, and
    each child's end with `exit PID WAIT_STATUS`, in the order they come: children run at once."""
    set_by_imports = _warm_up()
    import torch

    default_threads = torch.get_num_threads()
    del torch
    wake_read, wake_write = os.pipe()  # SIGCHLD writes here: select() wakes when a child ends
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # pytest's Ctrl-C is for pytest; the worker ends us
    requests = sys.stdin.fileno()

    def reply(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    reply(json.dumps({"sys.path": sys.path, "environ": dict(os.environ)}))  # ready, with what it imported
    pending = b""
    while True:
        ready, _, _ = select.select([requests, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        while True:  # every child that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reply(f"exit {pid} {status}")
        if requests in ready:
            data = os.read(requests, 1 << 16)
            if not data:  # the worker is gone
                return
            pending += data
            while b"\n" in pending:
                line, _, pending = pending.partition(b"\n")
                pid = os.fork()
                if pid == 0:
                    os.close(wake_read)
                    os.close(wake_write)
                    signal.set_wakeup_fd(-1)
                    _run_child(json.loads(line), set_by_imports, default_threads)  # never returns
                reply(f"start {pid}")


def _run_child(request: dict, set_by_imports: dict[str, str], default_threads: int) -> None:
    """In the forked child: become the command's process as a new interpreter would be, run
    it, finish as the interpreter does (threads joined, atexit, streams flushed), and exit."""
    import atexit
    import runpy
    import traceback
    import types

    import torch

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in set_by_imports.items():  # as mtrain's imports did in a new interpreter
            os.environ.setdefault(key, value)
        for fd, (path, flags) in enumerate(
            [
                (request["stdin"], os.O_RDONLY),
                (request["stdout"], os.O_WRONLY | os.O_APPEND),
                (request["stderr"], os.O_WRONLY | os.O_APPEND),
            ]
        ):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
        encoding, errors = sys.__stdout__.encoding, sys.__stdout__.errors
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(open(0, "rb", closefd=False), encoding, errors)
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            open(1, "wb", buffering=0 if unbuffered else -1, closefd=False),
            encoding,
            errors,
            line_buffering=unbuffered,
            write_through=unbuffered,
        )
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            open(2, "wb", buffering=0 if unbuffered else -1, closefd=False),
            encoding,
            "backslashreplace",
            line_buffering=True,
            write_through=unbuffered,
        )
        for number in range(1, signal.NSIG):  # a new interpreter's handlers
            if number in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        torch.set_num_threads(int(request["env"].get("OMP_NUM_THREADS") or default_threads))
        argv = request["argv"]
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        elif argv[0] == "-m":
            sys.argv = ["-m", *argv[2:]]
            sys.path[0] = request["cwd"]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # uncaught: a new interpreter prints it and dies by the signal
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # as at an interpreter's end: join threads
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # a reader that went away, as a new interpreter ignores it at exit
        pass
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


# ---------------------------------------------------------------------------- the test's side
class WarmProcess:
    """A worker's warm process: started at its first command, ended with the worker."""

    def __init__(self) -> None:
        env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
        self.log = tempfile.NamedTemporaryFile(prefix="mtrain-warm-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.warm_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd=REPO_ROOT,
            env=env,
        )
        self.ended: dict[int, int] = {}  # pid -> wait status, as the warm process reported them
        self._unread = b""
        ready_line = self._message(timeout=300)  # once it has imported all
        if ready_line is None:
            raise RuntimeError(f"the warm process did not start within 300 s (its log: {self.log.name})")
        ready = json.loads(ready_line)
        self.sys_path = {str(Path(entry).resolve()) for entry in ready["sys.path"] if entry}
        # Its environment after its imports (mtrain's set variables, as they do in this process).
        self.env = ready["environ"]
        self.fallbacks: dict[str, int] = {}  # variable -> commands it sent to a new interpreter
        atexit.register(self._log_fallbacks)

    def _log_fallbacks(self) -> None:
        """At the worker's end, into the warm process's log: which variables, set differently
        from the warm process's, sent how many commands to a new interpreter."""
        with open(self.log.name, "a", encoding="utf-8") as log:
            print(f"commands sent to a new interpreter, by variable: {self.fallbacks}", file=log)

    def _message(self, timeout: float | None) -> str | None:
        """The next line the warm process wrote (None when none came within `timeout`); an
        `exit PID STATUS` line is also recorded in `ended`."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._unread:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            data = os.read(fd, 1 << 16)
            if not data:
                raise RuntimeError(f"the warm process ended (its log: {self.log.name})")
            self._unread += data
        line, _, self._unread = self._unread.partition(b"\n")
        text = line.decode()
        if text.startswith("exit "):
            _, pid, status = text.split()
            self.ended[int(pid)] = int(status)
        return text

    def can_run(self, env: dict[str, str]) -> bool:
        """Whether a fork gives what a new interpreter with `env` would."""
        if self.process.poll() is not None:
            return False
        for key in set(env) ^ set(self.env) | {k for k in env if env.get(k) != self.env.get(k)}:
            if key in RUNTIME_ENV_KEYS or key.startswith("PYTEST_"):
                continue
            self.fallbacks[key] = self.fallbacks.get(key, 0) + 1
            return False
        extra = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
        return all(str(Path(entry).resolve()) in self.sys_path for entry in extra)

    def start(self, request: dict) -> int:
        """Fork a child for `request`; its pid."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        while True:
            message = self._message(timeout=60)
            if message is None:
                raise RuntimeError(f"the warm process did not start a command (its log: {self.log.name})")
            if message.startswith("start "):
                return int(message.split()[1])

    def wait_status(self, pid: int, timeout: float | None) -> int | None:
        """The child's wait status once it has ended; None if it has not within `timeout` (0: now)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.ended:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._message(left) is None:
                return None
        return self.ended[pid]


class WarmPopen:
    """What these tests use of subprocess.Popen (pid, returncode, poll, wait, send_signal, kill,
    terminate, communicate), for a command forked from the warm process. Its stdin is empty or
    the given bytes; its stdout and stderr are files, read by communicate() once it has ended."""

    def __init__(
        self,
        warm: WarmProcess,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        stdin: bytes,
        text: bool,
        stderr_file: Path | None = None,
    ):
        self.args, self.text, self.returncode = argv, text, None
        self._warm = warm
        self._scratch = tempfile.TemporaryDirectory(prefix="mtrain-warm-")
        self._files = {name: Path(self._scratch.name) / name for name in ("stdin", "stdout", "stderr")}
        if stderr_file is not None:
            self._files["stderr"] = Path(stderr_file)
        self._files["stdin"].write_bytes(stdin)
        self._files["stdout"].touch()
        self._files["stderr"].touch()
        files = {name: str(path) for name, path in self._files.items()}
        self.pid = warm.start({"argv": argv, "cwd": str(cwd), "env": env, **files})

    def poll(self) -> int | None:
        return self.wait(timeout=0, raise_on_timeout=False)

    def wait(self, timeout: float | None = None, raise_on_timeout: bool = True) -> int | None:
        if self.returncode is None:
            status = self._warm.wait_status(self.pid, timeout)
            if status is None:
                if raise_on_timeout:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> tuple:
        """(stdout, stderr) once the command has ended; TimeoutExpired (with what it wrote so
        far) if it has not within `timeout`, as subprocess.Popen's."""
        assert not input, "a warm command's stdin is given when it starts"
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired as expired:
            expired.output, expired.stderr = self._outputs()
            raise
        return self._outputs()

    def _outputs(self) -> tuple:
        out, err = self._files["stdout"].read_bytes(), self._files["stderr"].read_bytes()
        if self.text:  # decoded as subprocess does: the locale's encoding, universal newlines
            return tuple(io.TextIOWrapper(io.BytesIO(data)).read() for data in (out, err))
        return out, err


_warm: dict[str, WarmProcess] = {}  # this worker's, once started


def _warm_process_for(env: dict[str, str], new_interpreter: bool) -> WarmProcess | None:
    """This worker's warm process (started at the first command) if it can run a command with
    `env`; None where a new interpreter must (see the module docstring) or is asked for."""
    if new_interpreter or os.environ.get("MTRAIN_TEST_FRESH_PROCESSES") == "1" or not hasattr(os, "fork"):
        return None
    if "process" not in _warm or _warm["process"].process.poll() is not None:
        _warm["process"] = WarmProcess()
    return _warm["process"] if _warm["process"].can_run(env) else None


def start_python(
    *argv: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    input: bytes | str | None = None,
    text: bool = False,
    new_interpreter: bool = False,
    stderr_file: Path | None = None,
) -> WarmPopen | subprocess.Popen:
    """`subprocess.Popen([sys.executable, *argv], stdout=PIPE, stderr=PIPE, ...)` with its
    input given at the start, forked from the warm process where that is the same, unless the
    test asks for a `new_interpreter` (its start-up is part of what it checks). Read its output
    with communicate(), or its stderr as it runs from a `stderr_file` it appends to; a test
    that reads a running command's stdout uses Popen."""
    env = dict(os.environ if env is None else env)
    cwd = Path.cwd() if cwd is None else Path(cwd)
    data = input.encode() if isinstance(input, str) else (input or b"")
    warm = _warm_process_for(env, new_interpreter)
    if warm is not None:
        return WarmPopen(warm, list(argv), cwd, env, data, text, stderr_file)
    with contextlib.ExitStack() as files:
        process = subprocess.Popen(
            [sys.executable, *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if data else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr_file is None else files.enter_context(open(stderr_file, "ab")),
            text=text,
        )
    if data:  # small inputs: written at once, so that communicate() need not be given them
        assert process.stdin is not None
        process.stdin.write(data.decode() if text else data)
        process.stdin.close()
    return process


def run_python(
    *argv: str,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    input: bytes | str | None = None,
    text: bool = False,
    timeout: float = 300,
    new_interpreter: bool = False,
) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, *argv], capture_output=True, ...)`, forked from the
    worker's warm process where that is the same (see the module docstring), unless the test
    asks for a `new_interpreter`."""
    env = dict(os.environ if env is None else env)
    if _warm_process_for(env, new_interpreter) is None:
        return subprocess.run(
            [sys.executable, *argv], cwd=cwd, env=env, input=input, capture_output=True, text=text, timeout=timeout
        )
    process = start_python(*argv, cwd=cwd, env=env, input=input, text=text)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(list(argv), process.returncode, out, err)


def run_mtrain(*args: str, **options) -> subprocess.CompletedProcess:
    """`python -m mtrain *args` (see run_python for the options)."""
    return run_python("-m", "mtrain", *args, **options)


def start_mtrain(*args: str, **options) -> WarmPopen | subprocess.Popen:
    """`python -m mtrain *args` started (see start_python for the options)."""
    return start_python("-m", "mtrain", *args, **options)


if __name__ == "__main__":
    _serve()
