"""docs/DEPLOY.md and deploy/: the page shows the files as they are, its `mtrain serve`
commands compose, the extras it names exist and `.[dev]` holds them, and the proxy config and
the unit pass `nginx -t` and `systemd-analyze verify` where those are installed. The container
file's commands themselves run in scripts/check_deploy.py (minutes: it installs torch)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtrain.config import ServeConfig

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "DEPLOY.md").read_text(encoding="utf-8")
# The server's keys for a proxy, added by issue 49's server work: the page uses them before that
# work reaches this branch; once ServeConfig has them, this set is checked like every key.
ARGOS_SECOND_STEP = "pip install --no-deps argostranslate==1.11.0 stanza==1.10.1"


def check_deploy():
    spec = importlib.util.spec_from_file_location("check_deploy", REPO / "scripts" / "check_deploy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def test_the_page_shows_the_files_of_deploy_as_they_are():
    shown = blocks(PAGE)
    for name in ("Containerfile", "mtrain.service", "nginx.conf"):
        assert (REPO / "deploy" / name).read_text(encoding="utf-8") in shown, (
            f"docs/DEPLOY.md does not show deploy/{name}"
        )


def serve_commands() -> list[list[str]]:
    """Every `mtrain serve` command of the page and of deploy/, as argument lists."""
    script = check_deploy()
    lines = [line for block in blocks(PAGE) for line in block.splitlines() if "mtrain serve " in line]
    commands = [shlex.split(line[line.index("mtrain serve ") :].split(" #")[0]) for line in lines]
    _, _, cmd = script.containerfile_steps(REPO / "deploy" / "Containerfile")
    return [*commands, cmd, script.unit_command(REPO / "deploy" / "mtrain.service")]


def test_every_serve_command_uses_keys_mtrain_serve_has():
    from mtrain.cli.common import CONFIG_DIR
    from mtrain.config import register_configs
    from mtrain.hydra_internals import compose_jobs

    fields = {field.name for field in dataclasses.fields(ServeConfig)}
    commands = serve_commands()
    assert len(commands) >= 4 and any("trusted_proxies=[127.0.0.1]" in command for command in commands)
    register_configs()
    for command in commands:
        overrides = command[2:]
        unknown = [arg for arg in overrides if arg.split("=")[0].split(".")[0] not in fields]
        assert not unknown, f"{' '.join(command)}: mtrain serve has no key {unknown}"
        assert compose_jobs(CONFIG_DIR, "serve", overrides, multirun=False)
        assert "port=8080" in command  # the default port, as the proxy examples use it
    assert ServeConfig().port == 8080


def test_the_extras_exist_and_the_test_install_holds_them():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    names = {
        extra: {re.split(r"[<>=!~ \[;]", spec)[0].lower() for spec in specs}
        for extra, specs in {**extras, "base": project["dependencies"]}.items()
    }
    for extra in ("serve", "hf", "argos", "ct2", "mbr"):
        assert extra in names, f"pyproject.toml has no extra {extra}"
        assert names[extra] <= names["dev"] | names["base"], f"`.[dev]` (the tests) lacks what `[{extra}]` installs"
        assert f"`{extra}`" in PAGE, f"docs/DEPLOY.md's table does not name the extra {extra}"
    assert "spacy" not in {name for specs in names.values() for name in specs}
    assert '"/src[serve]"' in (REPO / "deploy" / "Containerfile").read_text(encoding="utf-8")
    # The Argos packages' second step, the same everywhere it is written.
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert ARGOS_SECOND_STEP.replace("pip install", "python -m pip install -q") in ci
    for text in (PAGE, (REPO / "pyproject.toml").read_text(encoding="utf-8"), (REPO / "README.md").read_text()):
        assert ARGOS_SECOND_STEP.removeprefix("pip install ") in text
    # The torch the container and the page install is the one CI tests.
    assert "pip install -q torch==2.13.0" in ci and "torch==2.13.0" in (REPO / "deploy" / "Containerfile").read_text()


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (apt-get install nginx-light)")
def test_nginx_accepts_the_proxy_config(tmp_path):
    nginx, _ = check_deploy().nginx_for_test(tmp_path, 8080, 8443, 8081)
    result = subprocess.run([*nginx, "-t"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    site = (tmp_path / "site.conf").read_text(encoding="utf-8")
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in site and "ssl_certificate " in site


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path):
    unit = check_deploy().unit_for_test(tmp_path, sys.executable)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_unit_bounds_memory_cpu_and_tasks():
    """Before: no bound; a server that grew past the machine's memory took its neighbours down."""
    settings = dict(
        line.split("=", 1)
        for line in (REPO / "deploy" / "mtrain.service").read_text(encoding="utf-8").splitlines()
        if "=" in line and not line.startswith("#")
    )
    gigabytes = {key: float(settings[key].removesuffix("G")) for key in ("MemoryHigh", "MemoryMax")}
    assert 0 < gigabytes["MemoryHigh"] < gigabytes["MemoryMax"] <= 16
    assert settings["MemorySwapMax"] == "0"
    assert re.fullmatch(r"[1-9][0-9]*%", settings["CPUQuota"]) and int(settings["TasksMax"]) >= 64
    assert settings["Restart"] == "on-failure"  # what brings a server killed at MemoryMax back


def test_the_proxy_limits_each_client_before_the_server():
    site = (REPO / "deploy" / "nginx.conf").read_text(encoding="utf-8")
    zones = re.findall(r"^limit_req_zone \$binary_remote_addr zone=(\w+):\d+m rate=\d+r/s;$", site, flags=re.M)
    connections = re.findall(r"^limit_conn_zone \$binary_remote_addr zone=(\w+):\d+m;$", site, flags=re.M)
    location = site[site.index("location / {") :]
    assert zones and re.search(rf"\n +limit_req zone={zones[0]} burst=\d+ nodelay;", location)
    assert connections and re.search(rf"\n +limit_conn {connections[0]} \d+;", location)
    assert "limit_req_status 429;" in location and "limit_conn_status 429;" in location


def test_the_base_image_is_pinned_by_version_and_digest():
    lines = (REPO / "deploy" / "Containerfile").read_text(encoding="utf-8").splitlines()
    (base,) = [line for line in lines if line.startswith("FROM ")]
    assert re.fullmatch(r"FROM docker\.io/library/python:3\.11\.\d+-slim-[a-z]+@sha256:[0-9a-f]{64}", base), base
