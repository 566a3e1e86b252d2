"""tests/ci_skips.py: under CI=true a skip for a missing [dev] package fails, other skips stay."""

from __future__ import annotations

import sys

import pytest

from tests.ci_skips import PYPROJECT, dev_distributions, dev_imports, missing_dev_package

# A [dev] package made unimportable for the inner session (None in sys.modules: ImportError).
# pytester restores sys.modules afterwards.
INNER = """
import sys

import pytest


def test_dev_package_missing():
    sys.modules["transformers"] = None
    pytest.importorskip("transformers")


def test_dev_package_missing_custom_reason():
    pytest.skip("hydra-optuna-sweeper is not installed (pip install 'mmtf[optuna]')")


def test_no_java():
    pytest.skip("METEOR needs a Java runtime")


def test_optional_tracker_missing():
    pytest.skip("mlflow: `mlflow` is not installed (pip install 'mmtf[mlflow]')")


@pytest.fixture
def needs_aac():
    sys.modules["aac_metrics"] = None
    pytest.importorskip("aac_metrics")


def test_dev_package_missing_in_a_fixture(needs_aac):
    pass
"""

MODULE_LEVEL = """
import sys

import pytest

sys.modules["transformers"] = None
transformers = pytest.importorskip("transformers")


def test_never_collected():
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch, ci: str | None):
    """The two files above in a session of their own, with this hook and no other plugin."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_inner=INNER, test_module_level=MODULE_LEVEL)
    return pytester.runpytest_inprocess("-p", "tests.ci_skips", "-p", "no:cacheprovider", "-rA",
                                        "--continue-on-collection-errors")


def test_on_ci_dev_skips_fail_and_name_the_package(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, "true")
    # errors: the fixture's skip (at setup) and the module-level one (at collection).
    result.assert_outcomes(failed=2, skipped=2, errors=2)
    result.stdout.fnmatch_lines([
        "*test_dev_package_missing *CI=true: skipped because 'transformers' is missing, but the "
        "[[]dev[]] extra installs it (pip install -e '.[[]dev[]]'); the skip was: could not "
        "import 'transformers'*"])
    result.stdout.fnmatch_lines(["*test_dev_package_missing_custom_reason*'hydra-optuna-sweeper'"
                                 " is missing*"])
    result.stdout.fnmatch_lines(["*test_dev_package_missing_in_a_fixture*'aac-metrics' is "
                                 "missing*"])
    result.stdout.fnmatch_lines(["ERROR test_module_level.py*'transformers' is missing*"])
    result.stdout.fnmatch_lines(["SKIPPED*METEOR needs a Java runtime*"])
    result.stdout.fnmatch_lines(["SKIPPED*mlflow*is not installed*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_without_ci_the_same_skips_stay_skips(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, "false")
    result.assert_outcomes(skipped=6)
    assert result.ret == pytest.ExitCode.OK


def test_dev_packages_are_read_from_pyproject():
    names = dev_distributions()
    # Through mmtf[optuna,slurm,hf,aac] and directly.
    assert {"transformers", "huggingface_hub", "aac-metrics", "hydra-optuna-sweeper",
            "hydra-submitit-launcher", "pycocoevalcap", "hypothesis"} <= names
    assert not {"wandb", "mlflow", "mmtf"} & names
    imports = dev_imports()
    assert imports["hydra_plugins.hydra_submitit_launcher"] == "hydra-submitit-launcher"
    assert imports["aac_metrics"] == "aac-metrics"
    assert PYPROJECT.is_file()


@pytest.mark.parametrize("message, expected", [
    ("could not import 'transformers': No module named 'transformers'", "transformers"),
    ("could not import 'transformers.generation.logits_process': No module named 'x'",
     "transformers"),
    ("could not import 'hydra_plugins.hydra_optuna_sweeper': No module", "hydra-optuna-sweeper"),
    ("hydra-submitit-launcher is not installed (pip install 'mmtf[slurm]')",
     "hydra-submitit-launcher"),
    ("could not import 'mlflow': No module named 'mlflow'", None),
    ("could not import 'transformers_extra': No module", None),
    ("wandb: `wandb` is not installed (pip install 'mmtf[wandb]')", None),
    ("real SPICE not runnable here: java not found", None),
])
def test_which_skip_messages_name_a_dev_package(message, expected):
    assert missing_dev_package(message) == expected


def test_the_suite_registers_the_hook():
    assert "tests.ci_skips" in sys.modules
