"""trainer=fsdp on two CPU ranks (gloo): one shard unit per transformer block, activation
checkpointing, and a resume from ``ckpt_path=last`` that ends bit-identical to an unbroken run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmtf.reliability import resolve_resume
from tests.forked import run_main
from tests.integration.fsdp_script import lora_net

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("fsdp_script.py")


def _fit(out: Path, steps: int, activation_checkpointing: bool, ckpt: str | None = None) -> dict:
    args = [str(out), str(steps), str(activation_checkpointing).lower(), *([ckpt] if ckpt else [])]
    # rank 0 forked from this worker, and rank 1 forked from rank 0 by Lightning (tests/forked.py)
    done = run_main(SCRIPT, args, cwd=out.parent, env={"OMP_NUM_THREADS": "1"}, timeout=300,
                    fork_ranks=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads((out / "units.json").read_text())


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def test_fsdp_shards_blocks_and_resumes_bit_exactly(tmp_path):
    unbroken = _fit(tmp_path / "unbroken", 8, activation_checkpointing=False)
    assert Path(resolve_resume("last", tmp_path / "unbroken")).name == "last.ckpt"
    # resumed from the unbroken run's step-4 checkpoint, with activation checkpointing on
    resumed = _fit(tmp_path / "resumed", 8, activation_checkpointing=True,
                   ckpt=str(tmp_path / "unbroken" / "checkpoints" / "step=4.ckpt"))
    assert resumed == {"units": ["FSDPNet", "FSDPTransformerBlock"], "param": "DTensor", "step": 8}
    assert unbroken["step"] == 8

    expected = _weights(tmp_path / "unbroken" / "end.ckpt")
    got = _weights(tmp_path / "resumed" / "end.ckpt")
    # Full (unsharded) tensors under the plain parameter names, whatever the checkpointing.
    assert set(got) == set(expected) and "net.stack.blocks.0.self_attn.to_q.weight" in got
    assert got["net.stack.blocks.0.mlp.fc_in.weight"].shape == (64, 16)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    started = _weights(tmp_path / "unbroken" / "checkpoints" / "step=4.ckpt")
    assert not torch.equal(started["net.out.weight"], expected["net.out.weight"])
    # LoRA on block 1 (base frozen inside a sharded unit): its base is the initial one bit for
    # bit, its adapters trained
    initial = {f"net.{k}": v for k, v in lora_net().state_dict().items()}
    block = [k for k in expected if k.startswith("net.stack.blocks.1.")]
    assert any(".lora_A." in k for k in block)
    for name in block:
        assert torch.equal(expected[name], initial[name]) == (".lora_" not in name), name
