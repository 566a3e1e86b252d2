"""What importing predicting and building a captioner load: nothing of training or speech.

Each check runs in a fresh interpreter, so modules other tests imported do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# Training-only modules: the built-in set generators, shards, the data modules and their
# loaders, LoRA, FSDP, the optimizer groups, EMA, the training CLI.
TRAINING_ONLY = ("mmtf.synthetic", "mmtf.data.shards", "mmtf.data.formats", "mmtf.data.datamodule",
                 "mmtf.data.loader", "mmtf.data.mixture", "mmtf.nn.lora", "mmtf.pretrained.peft",
                 "mmtf.tasks.fsdp", "mmtf.tasks.optim", "mmtf.tasks.ema", "mmtf.train",
                 "mmtf.reliability")
# Speech decoding: loaded only when a SpeechTask is built.
SPEECH = ("mmtf.tasks.speech", "mmtf.decoders.speech")


def loaded_after(code: str) -> list[str]:
    """The mmtf modules in sys.modules after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m for m in sys.modules " \
            f"if m.startswith('mmtf'))))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True, text=True,
                         capture_output=True, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    return json.loads(out.stdout.strip().splitlines()[-1])


def hits(modules: list[str], banned: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == b or m.startswith(b + ".") for b in banned)]


def test_import_predict_loads_no_training_or_speech_module():
    modules = loaded_after("import mmtf.predict")
    assert "mmtf.predict.inputs" in modules          # the probe does see mmtf modules
    assert hits(modules, TRAINING_ONLY + SPEECH) == []


def test_a_captioning_training_step_loads_no_speech_code():
    modules = loaded_after("""
import torch
from tests.unit.tasks.conftest import captioner
task = captioner()
batch = {"audio": torch.randn(2, 1600), "audio_lengths": torch.tensor([1600, 1200]),
         "tokens": torch.randint(4, 60, (2, 6))}
loss = task.training_step(batch, 0)
loss.backward()
""")
    assert "mmtf.tasks.captioning" in modules
    assert hits(modules, SPEECH) == []


def test_the_check_names_a_banned_module_and_its_submodules():
    assert hits(["mmtf.tasks.speech", "mmtf.synthetic.audio", "mmtf.synthetics", "mmtf.text"],
                TRAINING_ONLY + SPEECH) == ["mmtf.tasks.speech", "mmtf.synthetic.audio"]


def test_the_notebook_model_reads_through_to_its_task_and_copies():
    import copy

    from mmtf.errors import UserError
    from mmtf.predict.model import Model
    from tests.unit.tasks.conftest import captioner, classifier

    task = captioner()
    model = Model(task)
    assert model.generation is task.generation and model.modality == "audio"
    assert copy.deepcopy(model).task is not task
    with pytest.raises(UserError, match=r"caption: a ClassificationTask writes no captions"):
        Model(classifier()).caption([])
    with pytest.raises(UserError, match=r"transcribe: a CaptioningTask decodes no speech"):
        model.transcribe([])
