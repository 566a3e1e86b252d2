"""pyproject.toml against the code: declared imports, torch ranges, the lock, extras, scripts."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from mmtf.utils.config_dir import find_config_dir

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[Requirement]] = {
    name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()
}
CORE = [Requirement(r) for r in PROJECT["dependencies"]]


def _names(requirements: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements if r.name != "mmtf"}


def _extras_pulled_by(extra: str) -> set[str]:
    """``extra`` and the extras it pulls through ``mmtf[...]`` self-references."""
    seen, todo = set(), [extra]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [x for r in EXTRAS[name] if r.name == "mmtf" for x in r.extras]
    return seen


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported lazily) for every absolute import in ``path``.

    Lazy: inside a function, under ``if TYPE_CHECKING``, or in a ``try`` that catches
    ImportError -- code paths a user without the package never reaches or survives.
    """
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name.split(".")[0], lazy) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], lazy))
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or (
            isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)) or (
            isinstance(node, ast.Try) and any(
                h.type is not None and re.search(r"ImportError|ModuleNotFoundError",
                                                 ast.unparse(h.type)) for h in node.handlers))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


def test_every_third_party_import_is_declared():
    """Eager imports need a core dependency; lazy ones a core dependency or an extra."""
    providers = packages_distributions()
    core = _names(CORE)
    optional = set().union(*(_names(reqs) for reqs in EXTRAS.values()))
    problems = []
    for path in sorted((REPO / "mmtf").rglob("*.py")):
        for module, lazy in _imports(path):
            if module in sys.stdlib_module_names or module == "mmtf":
                continue
            # A module of a package that is not installed here: its distribution's usual name.
            dists = {canonicalize_name(d) for d in providers.get(module, [module])}
            allowed = core | optional if lazy else core
            if not dists & allowed:
                where = "an extra or core" if lazy else "core (or import it inside a function)"
                problems.append(f"{path.relative_to(REPO)}: {module} ({sorted(dists)}) is not "
                                f"declared in {where}")
    assert not problems, "\n".join(sorted(set(problems)))


def test_import_scan_sees_eager_lazy_and_guarded_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import numpy.linalg\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import wandb\n"
        "try:\n    import mlflow\nexcept ImportError:\n    mlflow = None\n"
        "def f():\n    from transformers import AutoModel\n"
        "from . import sibling\n")
    assert _imports(source) == [("numpy", False), ("typing", False), ("wandb", True),
                                ("mlflow", True), ("transformers", True)]


# torchvision release -> the torch it requires, read from each wheel's METADATA (Requires-Dist).
TORCHVISION_FOR_TORCH = {"2.11.0": "0.26.0", "2.12.1": "0.27.1", "2.13.0": "0.28.0",
                         "2.14.1": "0.29.1"}


@pytest.mark.parametrize("torch_version", sorted(TORCHVISION_FOR_TORCH))
def test_torch_range_admits_each_build_with_its_torchvision_and_torchaudio(torch_version):
    specs = {canonicalize_name(r.name): r.specifier for r in CORE}
    assert torch_version in specs["torch"]
    assert TORCHVISION_FOR_TORCH[torch_version] in specs["torchvision"]
    # torchaudio 2.11 is the last release; its wheels accept any torch >= 2.11.
    assert "2.11.0" in specs["torchaudio"]


def test_torch_range_stops_before_the_untested_major_and_minor():
    specs = {canonicalize_name(r.name): r.specifier for r in CORE}
    assert "2.10.0" not in specs["torch"] and "2.15.0" not in specs["torch"]


def _constraints() -> dict[str, Version]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_constraints_pin_every_tested_dependency_inside_its_range():
    """`make` installs core + [dev] with -c constraints.txt: each of them pinned, in range."""
    pins = _constraints()
    tested = CORE + [r for extra in _extras_pulled_by("dev") for r in EXTRAS[extra]]
    for requirement in tested:
        if requirement.name == "mmtf" or (requirement.marker and not requirement.marker.evaluate()):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints.txt does not pin {name}"
        assert pins[name] in requirement.specifier, f"{name}=={pins[name]} not in {requirement}"
    assert (pins["torch"], pins["torchvision"], pins["torchaudio"]) == (
        Version("2.14.1"), Version("0.29.1"), Version("2.11.0"))


def test_make_installs_with_the_constraints():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"pip install .*-c constraints\.txt -e '\.\[dev\]'", makefile)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_optional_packages_are_extras_not_core():
    core = _names(CORE)
    expected = {"optuna": "hydra-optuna-sweeper", "wandb": "wandb", "mlflow": "mlflow",
                "slurm": "hydra-submitit-launcher", "hf": "transformers", "aac": "aac-metrics"}
    for extra, package in expected.items():
        assert package in _names(EXTRAS[extra]), (extra, package)
        assert package not in core, f"{package} is a core dependency; it belongs in [{extra}]"
    assert "huggingface-hub" in _names(EXTRAS["hf"])
    assert {"pytest", "pytest-xdist", "hypothesis", "pycocoevalcap"} <= _names(EXTRAS["dev"])
    assert {"optuna", "slurm"} <= _extras_pulled_by("dev")   # composed/rendered by the tests
    assert "fsspec" in core


def test_optuna_config_names_its_extra():
    text = (REPO / "conf" / "hparams_search" / "optuna.yaml").read_text()
    assert "pip install 'mmtf[optuna]'" in text


@pytest.mark.parametrize("script", sorted(PROJECT["scripts"]))
def test_console_script_resolves_to_a_callable(script):
    module, _, attribute = PROJECT["scripts"][script].partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))


def test_data_check_is_a_console_script():
    assert PROJECT["scripts"]["mmtf-data-check"] == "mmtf.data.check:main"
    assert {"mmtf-train", "mmtf-evaluate", "mmtf-predict", "mmtf-export"} <= set(PROJECT["scripts"])


def _conf(root: Path) -> Path:
    (root / "conf").mkdir(parents=True)
    (root / "conf" / "train.yaml").write_text("seed: 1\n")
    return root / "conf"


def test_config_dir_prefers_the_installed_copy(tmp_path):
    package = tmp_path / "site-packages" / "mmtf"
    installed = _conf(package)
    _conf(tmp_path / "site-packages")           # an unrelated conf/ beside the package
    assert find_config_dir(package) == str(installed)


def test_config_dir_falls_back_to_the_checkout(tmp_path):
    checkout = _conf(tmp_path)
    (tmp_path / "mmtf").mkdir()
    assert find_config_dir(tmp_path / "mmtf") == str(checkout)


def test_config_dir_missing_names_both_places(tmp_path):
    (tmp_path / "mmtf").mkdir()
    with pytest.raises(RuntimeError, match=r"no train\.yaml in .*mmtf/conf or .*/conf; reinstall"):
        find_config_dir(tmp_path / "mmtf")


def test_this_checkout_uses_its_own_conf():
    assert find_config_dir() == str(REPO / "conf")


def test_optuna_sweep_composes_with_the_extra_installed():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper",
                        reason="hydra-optuna-sweeper is not installed (pip install 'mmtf[optuna]')")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=audio_captioning", "hparams_search=optuna"],
                      return_hydra_config=True)
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper")
    assert cfg.hydra.sweeper.direction == f"{cfg.optimized_mode}imize"
