"""Check docs/DEPLOY.md's files for real: the container file's commands, the reverse proxy, the unit.

    python scripts/check_deploy.py [--run RUN_DIR] [--torch-index URL] [--keep]

1. deploy/Containerfile: its RUN commands run, as written, in a fresh virtualenv (its VENV and
   /src point into a temporary folder; `useradd` is left out: it would add a user to this
   machine), then its CMD serves a model (`run=/model` given the run to serve) and answers
   /health and a translation.
2. deploy/nginx.conf in front of deploy/mtrain.service's `mtrain serve` command: a self-signed
   certificate stands in for Let's Encrypt's, the ports are free ones; `nginx -t`, then an HTTPS
   translation through nginx (the Host header the server allows), 40 requests at once of which
   limit_req refuses some with 429, and the HTTP redirect.
3. deploy/mtrain.service passes `systemd-analyze verify` (its ExecStart pointed at the new venv).

Without --run it trains a tiny model on a Multi30k slice ($MTRAIN_DATA_DIR) with the new venv, as
.ci/wheel_check does. --torch-index: where torch's CPU wheel comes from (the Containerfile's
TORCH_INDEX; here without internet, e.g. file:///opt/pypi/simple where pip finds a local wheel).
Each step prints its wall time; the first exit status not 0 ends the check (status 1). The
install takes minutes (torch), so this is a script, not a test; tests/test_deploy.py checks
cheaply that the docs show these files and that their commands compose.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"


def containerfile_steps(path: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """(ARG and ENV defaults, RUN commands, CMD as a list) of a Containerfile; continued lines joined."""
    text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
    defaults: dict[str, str] = {}
    runs: list[str] = []
    cmd: list[str] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            defaults[key] = value
        elif word == "ENV":  # PATH names the image's venv: the check calls the new venv's programs by path
            defaults.update(part.split("=", 1) for part in shlex.split(rest) if "=" in part and part[:5] != "PATH=")
        elif word == "RUN":
            runs.append(rest)
        elif word == "CMD":
            cmd = json.loads(rest)
    return defaults, runs, cmd


def unit_command(path: Path) -> list[str]:
    """The ExecStart command line of a systemd unit, split as systemd splits it (no shell)."""
    line = next(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def step(name: str, command: list[str] | str, **options) -> subprocess.CompletedProcess:
    start = time.perf_counter()
    result = subprocess.run(command, shell=isinstance(command, str), text=True, capture_output=True, **options)
    print(f"{name}: exit {result.returncode} in {time.perf_counter() - start:.1f} s", flush=True)
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:], sep="\n", file=sys.stderr)
        sys.exit(1)
    return result


def wait_for(url: str, server: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server ended (status {server.returncode}) before answering {url}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"no answer from {url} within {seconds:.0f} s")


def translate(url: str) -> str:
    request = urllib.request.Request(
        url, data=json.dumps({"text": ["Ein Hund läuft."]}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["translations"][0]


def tiny_run(venv: Path, work: Path) -> Path:
    """A 3-update model on 200 Multi30k pairs, trained by the new venv's mtrain."""
    data_dir = Path(os.environ.get("MTRAIN_DATA_DIR", REPO.parent / "shared" / "data")) / "multi30k"
    data = work / "data"
    data.mkdir()
    for split, count in (("train", 200), ("val", 50), ("test_2016_flickr", 50)):
        for lang in ("de", "en"):
            lines = subprocess.run(["zcat", str(data_dir / f"{split}.{lang}.gz")], capture_output=True, text=True)
            (data / f"{split}.{lang}").write_text("".join(lines.stdout.splitlines(True)[:count]), encoding="utf-8")
    run = work / "run"
    step(
        "a tiny model (mtrain fit, the new venv)",
        [str(venv / "bin" / "mtrain"), "fit", f"data.local_dir={data}", f"data.cache_dir={work / 'cache'}",
         "model.layers=1", "model.d_model=32", "model.heads=2", "model.ffn_dim=64", "tokenizer.vocab_size=200",
         "train.max_updates=3", "train.valid_bleu=false", "decode.beam=1", "decode.max_len_a=1.0",
         "decode.max_len_b=5", f"hydra.run.dir={run}"],
        cwd=work,
    )  # fmt: skip
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="the run (or export) to serve; default: train a tiny one")
    parser.add_argument("--torch-index", help="the Containerfile's TORCH_INDEX (default: its own)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mtrain_deploy_"))
    servers: list[subprocess.Popen] = []
    try:
        venv, src = work / "venv", work / "src"
        files = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
        for name in files:  # the build context: the checkout without what git ignores (runs/, .venv, ...)
            if (REPO / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, src / name)
        defaults, runs, cmd = containerfile_steps(DEPLOY / "Containerfile")
        env = {**os.environ, **defaults, "VENV": str(venv)}
        if args.torch_index:
            env["TORCH_INDEX"] = args.torch_index
        env.pop("PYTHONPATH", None)  # the new venv's mtrain, not a checkout's
        for command in runs:
            if command.startswith("useradd"):
                print(f"left out (adds a user to this machine): RUN {command}")
                continue
            step(f"RUN {command[:70]}...", command.replace("/src", str(src)), env=env, cwd=work)
        size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True).stdout.split()[0]
        print(f"the installed virtualenv: {size}")
        run = Path(args.run).resolve() if args.run else tiny_run(venv, work)

        port = free_port()
        served = [arg.replace("run=/model", f"run={run}") for arg in cmd]
        served = [f"port={port}" if arg.startswith("port=") else arg for arg in served]
        served[0] = str(venv / "bin" / served[0])
        start = time.perf_counter()
        servers.append(subprocess.Popen(served, env=env, cwd=work, stderr=subprocess.DEVNULL))
        wait_for(f"http://127.0.0.1:{port}/health", servers[-1])
        print(f"CMD {' '.join(cmd)}: answers {translate(f'http://127.0.0.1:{port}/translate')!r} "
              f"({time.perf_counter() - start:.1f} s from start)")  # fmt: skip
        servers.pop().terminate()

        check_proxy_and_unit(work, venv, run, env)
    finally:
        for server in servers:
            server.terminate()
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def check_proxy_and_unit(work: Path, venv: Path, run: Path, env: dict[str, str]) -> None:
    """The unit's server behind nginx with TLS, `nginx -t` first; `systemd-analyze verify`."""
    port, https, http_port = free_port(), free_port(), free_port()
    unit = unit_command(DEPLOY / "mtrain.service")
    unit[0] = str(venv / "bin" / "mtrain")
    unit = [arg.replace("run=/srv/mtrain/model", f"run={run}") for arg in unit]
    unit = [f"port={port}" if arg.startswith("port=") else arg for arg in unit]
    keys = subprocess.run([unit[0], "serve", "--help"], env=env, capture_output=True, text=True).stdout
    missing = [arg for arg in unit[2:] if "=" in arg and f"\n    {arg.split('=')[0]} " not in keys]
    if missing:  # keys of a newer mtrain than the one installed: say so, serve without them
        print(f"left out of the unit's command (this mtrain serve has no such keys): {' '.join(missing)}")
        unit = [arg for arg in unit if arg not in missing]
    server = subprocess.Popen(unit, env=env, cwd=work, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/health", server)
        if shutil.which("nginx") is None:
            print("nginx: not installed (apt-get install nginx-light): the proxy is not checked")
        else:
            check_nginx(work, port, https, http_port)
    finally:
        server.terminate()
    if shutil.which("systemd-analyze") is None:
        print("systemd-analyze: not installed: the unit is not checked")
        return
    unit_file = unit_for_test(work, str(venv / "bin" / "mtrain"))
    step("systemd-analyze verify deploy/mtrain.service", ["systemd-analyze", "verify", str(unit_file)])


def nginx_for_test(work: Path, port: int, https: int, http_port: int) -> tuple[list[str], Path]:
    """deploy/nginx.conf made runnable in `work`: a self-signed certificate for mt.example.org in
    place of Let's Encrypt's, the given ports on 127.0.0.1, a top-level config around it.
    Returns the nginx command (add `-t`, or `-g 'daemon off;'`) and the certificate."""
    certificate, key = work / "fullchain.pem", work / "privkey.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=mt.example.org", "-addext", "subjectAltName=DNS:mt.example.org",
         "-keyout", str(key), "-out", str(certificate)],
        check=True, capture_output=True,
    )  # fmt: skip
    site = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    site = site.replace("/etc/letsencrypt/live/mt.example.org/fullchain.pem", str(certificate))
    site = site.replace("/etc/letsencrypt/live/mt.example.org/privkey.pem", str(key))
    site = site.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    site = re.sub(r"\n *listen \[::\]:\d+[^;]*;", "", site)  # IPv6 may be off on the checking machine
    site = site.replace("listen 443 ssl;", f"listen 127.0.0.1:{https} ssl;")
    site = site.replace("listen 80;", f"listen 127.0.0.1:{http_port};")
    (work / "site.conf").write_text(site, encoding="utf-8")
    (work / "nginx.conf").write_text(
        f"pid {work}/nginx.pid;\nerror_log {work}/error.log;\nevents {{}}\n"
        f"http {{\n  access_log {work}/access.log;\n  client_body_temp_path {work}/body;\n"
        f"  proxy_temp_path {work}/proxy;\n  include {work}/site.conf;\n}}\n",
        encoding="utf-8",
    )
    return ["nginx", "-p", str(work), "-c", str(work / "nginx.conf")], certificate


def unit_for_test(work: Path, mtrain: str) -> Path:
    """deploy/mtrain.service with its ExecStart's program at `mtrain` (verify wants it to exist)."""
    text = (DEPLOY / "mtrain.service").read_text(encoding="utf-8")
    (work / "mtrain.service").write_text(text.replace("/opt/mtrain/bin/mtrain", mtrain), encoding="utf-8")
    return work / "mtrain.service"


def check_nginx(work: Path, port: int, https: int, http_port: int) -> None:
    nginx, certificate = nginx_for_test(work, port, https, http_port)
    step("nginx -t (deploy/nginx.conf, the test's certificate and ports)", [*nginx, "-t"])
    proxy = subprocess.Popen([*nginx, "-g", "daemon off;"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        # mt.example.org resolves to 127.0.0.1 only inside this check: connect there, name it in Host and SNI.
        context = ssl.create_default_context(cafile=str(certificate))
        connection = http.client.HTTPSConnection("127.0.0.1", https, context=context, timeout=60)
        connection.sock = context.wrap_socket(
            socket.create_connection(("127.0.0.1", https)), server_hostname="mt.example.org"
        )
        body = json.dumps({"text": ["Ein Hund läuft."]})
        connection.request("POST", "/translate", body, {"Host": "mt.example.org", "Content-Type": "application/json"})
        answer = connection.getresponse()
        text = answer.read().decode()
        if answer.status != 200:
            sys.exit(f"through nginx: HTTP {answer.status}: {text}")
        print(f"HTTPS through nginx: 200, {json.loads(text)['translations'][0]!r}")
        statuses = []
        for _ in range(40):  # faster than limit_req's rate and past its burst: the proxy answers 429
            tls = context.wrap_socket(socket.create_connection(("127.0.0.1", https)), server_hostname="mt.example.org")
            burst = http.client.HTTPSConnection("127.0.0.1", https, context=context, timeout=60)
            burst.sock = tls
            burst.request("GET", "/health", headers={"Host": "mt.example.org"})
            statuses.append(burst.getresponse().status)
            burst.close()
        if 429 not in statuses or statuses[0] != 200:
            sys.exit(f"40 requests at once through nginx: {statuses}, no 429 from limit_req")
        print(f"40 requests at once through nginx: {statuses.count(200)} x 200, then {statuses.count(429)} x 429")
        plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        plain.request("GET", "/", headers={"Host": "mt.example.org"})
        redirect = plain.getresponse()
        if redirect.status != 301 or not redirect.getheader("Location", "").startswith("https://mt.example.org"):
            sys.exit(f"plain HTTP: {redirect.status} {redirect.getheader('Location')}, not a redirect to https")
        print(f"HTTP: 301 to {redirect.getheader('Location')}")
    finally:
        proxy.terminate()


if __name__ == "__main__":
    main()
