"""Under ``CI=true``, a test skipped because a package of pyproject.toml's ``[dev]`` extra is
missing fails instead, naming the package.

CI installs ``.[dev]``; a skip there means the install broke (or a package was dropped from
the extra), and the run would pass without the tests that need the package (the transformers
parity tests, aac-metrics, the Hydra plugins). Skips for what ``[dev]`` does not install (a
GPU, Java and the CoreNLP jars, wandb/mlflow) stay skips. A skip names a missing package in the
two forms the suite writes: ``pytest.importorskip("x")`` ("could not import 'x': ...") and a
reason of the form "<distribution> is not installed". Registered by tests/conftest.py.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# Import names that are not the distribution's name with "-" -> "_".
IMPORT_NAMES = {"hydra-optuna-sweeper": "hydra_plugins.hydra_optuna_sweeper",
                "hydra-submitit-launcher": "hydra_plugins.hydra_submitit_launcher",
                "pytest-xdist": "xdist"}
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def dev_distributions(pyproject: Path = PYPROJECT) -> set[str]:
    """Every distribution the ``[dev]`` extra installs, the ``mmtf[...]`` extras it names
    expanded (lower case, as written in pyproject.toml)."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    names: set[str] = set()

    def add(extra: str) -> None:
        for requirement in extras[extra]:
            name, inner = _REQUIREMENT.match(requirement).groups()
            if name.lower() == "mmtf":
                for other in (inner or "").split(","):
                    add(other.strip())
            else:
                names.add(name.lower())

    add("dev")
    return names


def dev_imports(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{import name: distribution} of the ``[dev]`` extra."""
    return {IMPORT_NAMES.get(d, d.replace("-", "_")): d for d in dev_distributions(pyproject)}


def missing_dev_package(message: str, imports: dict[str, str] | None = None) -> str | None:
    """The ``[dev]`` distribution a skip message says is missing, None if it names none."""
    imports = dev_imports() if imports is None else imports
    found = re.search(r"could not import '([\w.]+)'", message)
    if found:
        module = found.group(1)
        for name, distribution in imports.items():
            if module == name or module.startswith(f"{name}."):
                return distribution
    for distribution in imports.values():
        if re.search(rf"(?<![\w-]){re.escape(distribution)} is not installed", message):
            return distribution
    return None


def _on_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_message(longrepr) -> str:
    # A skip's longrepr is (path, line, "Skipped: <reason>").
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return message.removeprefix("Skipped: ")


def _fail_if_dev_skip(report) -> None:
    if not (report.skipped and _on_ci()):
        return
    message = _skip_message(report.longrepr)
    distribution = missing_dev_package(message)
    if distribution is None:
        return
    report.outcome = "failed"
    report.longrepr = (f"CI=true: skipped because {distribution!r} is missing, but the [dev] "
                       f"extra installs it (pip install -e '.[dev]'); the skip was: {message}")
    if hasattr(report, "wasxfail"):
        del report.wasxfail


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_if_dev_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module-level ``importorskip`` skips the whole file at collection."""
    outcome = yield
    _fail_if_dev_skip(outcome.get_result())
