"""experiments/llm_decoding/run.py --tiny in-process: the table, the last-line JSON, mmtf's
greedy tokens equal to transformers' generate (the independent reference), and results.jsonl
written only with --record."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[3] / "experiments" / "llm_decoding" / "run.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("llm_decoding_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("record", [False, True])
def test_tiny_run_prints_equal_tokens_and_ratios_last(script, monkeypatch, capsys, record):
    recorded = []
    monkeypatch.setattr(script, "append_result",
                        lambda folder, result: recorded.append((Path(folder), dict(result))))
    # The suite's thread count, so the run leaves it as it found it.
    argv = ["--tiny", "--repeats", "1", "--max-new-tokens", "12",
            "--threads", str(torch.get_num_threads()), *(["--record"] if record else [])]
    verbosity = transformers.logging.get_verbosity()     # the script quiets transformers
    try:
        returned = script.main(argv)
    finally:
        transformers.logging.set_verbosity(verbosity)
    lines = capsys.readouterr().out.strip().splitlines()
    last = json.loads(lines[-1])
    assert last == json.loads(json.dumps(returned))
    assert last["tokens_equal"] is True
    assert last["ratio_batch1"] > 0 and last["ratio_batch8"] > 0
    assert last["tiny"] is True and last["max_new_tokens"] == 12
    # 2 layers x (q 64x64 + k, v 64x32 + o 64x64 + gate, up, down 3 x 64x128 + 2 norms 64)
    # + final norm 64 + tied embedding 1000x64.
    assert last["parameters"] == 2 * (4096 + 4096 + 4096 + 3 * 8192 + 128) + 64 + 64000
    assert last["weight_bytes"] == 4 * last["parameters"]          # fp32
    table = [line for line in lines if line.startswith("| mmtf |")
             or line.startswith("| transformers |")]
    assert [line.split("|")[2].strip() for line in table] == ["1", "1", "8", "8"]
    assert any(line.startswith("cpu capability") for line in lines)
    if record:
        assert recorded == [(SCRIPT, last)]
    else:
        assert recorded == []
