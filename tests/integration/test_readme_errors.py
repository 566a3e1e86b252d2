"""The README's error example is what its command prints (run in-process, exit status 2)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from .conftest import cli_in_process

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_error_examples() -> list[tuple[list[str], str]]:
    """``(argv after 'python -m', expected stderr)`` of every fenced ``$ python -m mmtf...`` block
    whose output is an ``mmtf: error:`` line."""
    examples = []
    for block in re.findall(r"```\n(\$ python -m mmtf[^\n]*\n[^`]*?)```", README.read_text()):
        command, *output = block.strip().splitlines()
        if output and output[0].startswith("mmtf: error:"):
            examples.append((shlex.split(command[2:])[2:], "\n".join(output)))
    return examples


EXAMPLES = readme_error_examples()


def test_the_readme_shows_an_error_example():
    assert EXAMPLES, f"{README}: no '$ python -m mmtf...' block followed by 'mmtf: error:'"


@pytest.mark.parametrize("argv, expected", EXAMPLES, ids=[" ".join(a) for a, _ in EXAMPLES])
def test_readme_error_example_is_what_the_command_prints(argv, expected, tmp_path):
    module, *overrides = argv
    # In-process through cli_in_process, which puts back the logging Hydra configures (its
    # console handler on this test's captured stream broke later tests' log lines), the matmul
    # precision and the environment; outputs/ of the failed start land in tmp_path.
    env = {"HYDRA_FULL_ERROR": "0", "MMTF_DATA_DIR": str(tmp_path / "data")}  # the user's view
    out = cli_in_process(module, overrides, cwd=tmp_path, env=env)
    assert out.returncode == 2, out.stderr[-3000:]
    # Log lines (Lightning's 'Seed set') may come first; the error is the last line.
    assert out.stderr.strip().splitlines()[-1] == expected
    assert not (tmp_path / "data").exists(), "the model must fail before any data is generated"
