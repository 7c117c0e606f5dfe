"""The wheel's contents (pyproject.toml) and where an installed mtrain finds configs/.

.ci/wheel_check builds the wheel and runs it outside the checkout; these are the quick checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtrain.cli.common import CONFIG_DIR, find_config_dir

REPO = Path(__file__).resolve().parents[1]


def test_every_package_and_config_file_is_in_the_wheel():
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "mtrain").rglob("__init__.py")}
    assert set(setuptools["packages"]) == on_disk | {"mtrain.configs"}
    assert setuptools["package-dir"] == {"mtrain.configs": "configs"}
    patterns = setuptools["package-data"]["mtrain.configs"]
    shipped = {path for pattern in patterns for path in (REPO / "configs").glob(pattern)}
    assert shipped == set((REPO / "configs").rglob("*.yaml"))
    data = setuptools["package-data"]  # beyond configs/: the page of `mtrain serve`, the Argos packages' splitter
    for package, name in (("serve", "translate.html"), ("export", "keep_lines_whole.onnx")):
        assert [path.name for path in (REPO / "mtrain" / package).glob(data[f"mtrain.{package}"][0])] == [name]


def test_config_dir_is_the_installed_copy_else_the_checkouts(tmp_path):
    checkout_package = tmp_path / "checkout" / "mtrain"
    checkout_package.mkdir(parents=True)
    assert find_config_dir(checkout_package) == tmp_path / "checkout" / "configs"
    wheel_package = tmp_path / "site-packages" / "mtrain"
    (wheel_package / "configs").mkdir(parents=True)
    assert find_config_dir(wheel_package) == wheel_package / "configs"
    assert Path(CONFIG_DIR) == REPO / "configs"  # this checkout
