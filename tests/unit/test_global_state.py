"""tests/conftest.py's ``_no_global_state_leaked``: what an in-process CLI leaves behind (a
console handler on a stream that is then closed, root at INFO, the matmul precision, Lightning's
seed variable, deterministic algorithms) is seen and put back, so later tests log and compute as
they would alone."""

from __future__ import annotations

import io
import logging
import os

import torch

from tests.conftest import _global_state, _restore


def test_a_leaked_handler_level_precision_and_seed_are_seen_and_put_back():
    named = logging.getLogger("tests.global_state")        # a logger that exists before
    before = _global_state()
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    named.propagate = False
    torch.set_float32_matmul_precision("medium" if before["matmul_precision"] != "medium"
                                       else "high")
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ["PL_GLOBAL_SEED"] = "123"
    stream.close()                                    # what pytest does to its capture
    leaked = _global_state()
    assert all(leaked[key] != before[key] for key in ("matmul_precision", "deterministic", "env"))
    assert leaked["loggers"][""] != before["loggers"][""]
    _restore(before)
    after = _global_state()
    assert {name: after["loggers"][name] for name in before["loggers"]} == before["loggers"]
    assert {key: after[key] for key in ("matmul_precision", "deterministic", "env")} == {
        key: before[key] for key in ("matmul_precision", "deterministic", "env")}
    assert handler not in root.handlers and named.propagate
    logging.getLogger("mmtf.test").warning("no '--- Logging error ---' after the restore")
