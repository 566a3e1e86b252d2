"""`pip install .` (not editable) as a user does it, then the CLIs from an unrelated directory.

The wheel is installed with ``--no-deps`` into a fresh venv that sees this interpreter's
site-packages through a ``.pth`` file, so torch and the rest are not downloaded again; the
checkout is not on that venv's path, so ``mmtf`` and its configs come from the wheel.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import CONF, REPO, tiny_overrides

pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def _run(args: list, cwd: Path, env: dict | None = None, timeout: float = 300):
    out = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"{args[:4]}...\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(venv, its site-packages) with the mmtf wheel built from a copy of this checkout."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"      # a copy: the build's build/ and *.egg-info stay out of the repo
    source.mkdir()
    for name in SOURCES:
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "mmtf", source / "mmtf", ignore=ignore)
    shutil.copytree(CONF, source / "conf", ignore=ignore)
    wheels = root / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", wheels, source], cwd=root)
    (wheel,) = wheels.glob("mmtf-*.whl")

    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=root).stdout.strip())
    (purelib / "host_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # Without PYTHONPATH: a checkout on it (its mmtf.egg-info) reads as "already installed".
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
         cwd=root, env=_user_env())
    return wheel, venv, purelib


def _user_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "HYDRA_FULL_ERROR": "1", "PYTHONUNBUFFERED": "1"}


def test_wheel_ships_every_config(installed):
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n for n in archive.namelist() if n.startswith("mmtf/conf/")}
    expected = {f"mmtf/conf/{p.relative_to(CONF).as_posix()}" for p in CONF.rglob("*.yaml")}
    assert shipped == expected


def test_installed_mmtf_uses_its_own_configs(installed, tmp_path):
    _, venv, purelib = installed
    out = _run([venv / "bin" / "python", "-c",
                "import mmtf.utils.config_dir as c, mmtf; print(mmtf.__file__); print(c.CONF_DIR)"],
               cwd=tmp_path, env=_user_env())
    module, conf_dir = out.stdout.split()
    assert module == str(purelib / "mmtf" / "__init__.py")
    assert conf_dir == str(purelib / "mmtf" / "conf")


def test_installed_cli_trains_from_an_unrelated_directory(installed, tmp_path, data_dir):
    _, venv, _ = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    args = tiny_overrides("audio_captioning", data_dir, "trainer.fast_dev_run=true")
    out = _run([venv / "bin" / "mmtf-train", *args], cwd=work, env=_user_env())
    assert "Traceback" not in out.stderr
    assert list((work / "outputs" / "audio_captioning" / "runs").glob("*/config.yaml"))


def test_installed_data_check_composes_its_config(installed, tmp_path):
    _, venv, _ = installed
    out = _run([venv / "bin" / "mmtf-data-check", "--cfg", "job"], cwd=tmp_path,
               env=_user_env())
    assert "data:" in out.stdout
