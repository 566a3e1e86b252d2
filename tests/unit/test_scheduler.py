"""tests/conftest.py's xdist scheduler: a module with a module-scoped fixture is one unit of work
(its fixture built once), every other test its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import pytest_xdist_make_scheduler


def scheduler(pytester: pytest.Pytester, *args: str):
    config = pytester.parseconfig(*args)
    return pytest_xdist_make_scheduler(config, None)


def test_a_module_with_a_module_fixture_is_one_scope_and_other_tests_are_their_own(pytester):
    pytester.makepyfile(test_shared='''
        import pytest

        @pytest.fixture(scope="module")
        def trained():
            return 1

        def test_a(trained): pass
        def test_b(): pass
        ''', test_plain="def test_c(): pass\ndef test_d(): pass\n")
    sched = scheduler(pytester, "--tx", "2*popen", "--dist", "load")   # what -n 2 becomes
    assert Path(pytester.path).samefile(sched.config.rootpath)
    assert {sched._split_scope(n) for n in ("test_shared.py::test_a", "test_shared.py::test_b")} \
        == {"test_shared.py"}
    assert [sched._split_scope(n) for n in ("test_plain.py::test_c", "test_plain.py::test_d")] \
        == ["test_plain.py::test_c", "test_plain.py::test_d"]


def test_other_dist_modes_are_left_to_xdist(pytester):
    assert scheduler(pytester, "-n", "2", "--dist", "loadfile") is None
