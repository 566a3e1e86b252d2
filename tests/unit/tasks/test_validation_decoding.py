"""Validation decodes with the fastest path that gives the reference tokens: the cached eager step.

The compiled step (``generation.compile=true``) is faster per token but compiles again whenever
the weights change, i.e. before every validation of a training run (tens of seconds on a CPU,
more than a whole validation pass of the default run), so the configured default keeps the
eager step with the KV cache.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from mmtf.decoders import GenerationConfig
from tests.unit.tasks.conftest import captioner

CAPTIONER = Path(__file__).resolve().parents[3] / "conf" / "model" / "captioner.yaml"


def test_validation_generates_the_uncached_reference_tokens_with_the_cached_eager_step():
    generation = yaml.safe_load(CAPTIONER.read_text())["generation"]
    task = captioner(generation=generation).eval()
    task.tokenizer = SimpleNamespace(decode_batch=lambda rows: rows)    # ids through unchanged
    used = []
    generate = task.model.generate

    def spy(*args, **options):
        used.append(GenerationConfig.build(None, **options))
        return generate(*args, **options)

    task.model.generate = spy
    wave, lengths = torch.randn(3, 8000), torch.tensor([8000, 6000, 4000])
    tokens = task.generate_captions(wave, lengths)
    assert used and used[0].use_cache and not used[0].compile
    reference = generate(wave, lengths, **{**generation, "use_cache": False}).tokens
    assert tokens == reference.tolist()
