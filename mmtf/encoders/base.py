"""What every mmtf encoder shares: its output type, pooling, pretrained loading and freezing.

Every encoder is called the same way, ``out = encoder(inputs, lengths=None)``, and returns an
:class:`EncoderOutput` of ``memory`` (b, s, c) and ``mask`` (b, s), so any encoder plugs into any
decoder (cross-attention ``context`` / ``context_mask``) or downstream head (:func:`pool`).

Pretrained weights are an export folder (``weights.safetensors`` + ``config.yaml``) that
:meth:`Encoder.load_pretrained` compares in full before copying (never unpickling); Hugging
Face folders are read by :mod:`mmtf.pretrained`.

Shapes: b batch, s memory length (frames or patches, CLS included), c = dim.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.hub import ExportFolder, open_export
from mmtf.nn.positions import FixedPositions
from mmtf.utils.parts import flatten_parts

PoolMode = Literal["mean", "cls", "last"]
POOL_MODES: tuple[str, ...] = ("mean", "cls", "last")
# Settings a downstream run may change on a pretrained encoder (a text encoder's pooling mode and
# normalisation among them); every other must equal the export's.
TUNABLE_KEYS = frozenset({"dropout", "attn_dropout", "freq_masks", "freq_mask_width", "time_masks",
                          "time_mask_width", "time_mask_mode", "time_mask_fraction",
                          "time_mask_multiplicity", "max_seconds",
                          "activation_checkpointing", "mode", "normalize"})
# Norm layers whose buffers are learned running statistics: loaded from an export, not compared.
RUNNING_STATS_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
                       nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
# Buffers loaded from an export, not compared: learned statistics, and fixed position tables,
# which an import may have replaced by the original's (Whisper's float32 sinusoids).
LOADED_BUFFER_MODULES = (*RUNNING_STATS_NORMS, FixedPositions)


class EncoderOutput(NamedTuple):
    """What an encoder returns.

    Attributes:
        memory: (b, s, c) float; positions where ``mask`` is False are zeros.
        mask: (b, s) bool, True = a valid position (the decoder's ``context_mask``).
    """

    memory: Tensor
    mask: Tensor


def pool(memory: Tensor, mask: Tensor | None = None, mode: PoolMode = "mean", *,
         encoder: Encoder | None = None) -> Tensor:
    """Pool encoder memory to one vector per item for a downstream head.

    Args:
        memory: (b, s, c).
        mask: (b, s) bool, True = valid; None = all valid.
        mode: "mean" (masked mean over valid positions), "cls" (the first valid position: the
            CLS token of a vision encoder or of a BERT-style text) or "last" (the last valid
            position: a causal text encoder's end-of-text token).
        encoder: the encoder that produced ``memory``: "cls" is checked against its
            ``has_cls``, "mean" leaves out its prefix tokens (as timm's ``global_pool="avg"``).

    Returns (b, c).

    Raises:
        ValueError: bad shapes. UserError: unknown ``mode``, or "cls" without a CLS token.
    """
    if memory.dim() != 3:
        raise ValueError(f"pool: memory must be (batch, length, dim), got {tuple(memory.shape)}.")
    if mask is not None and (mask.dtype != torch.bool or mask.shape != memory.shape[:2]):
        raise ValueError(f"pool: mask must be bool of shape {tuple(memory.shape[:2])}, got "
                         f"{mask.dtype} {tuple(mask.shape)}; pass out.mask from the encoder.")
    if mode not in POOL_MODES:
        raise UserError(f"pool: mode ({mode!r}) must be one of {', '.join(POOL_MODES)}.")
    if mode in ("cls", "last"):
        if mode == "cls" and encoder is not None and not encoder.has_cls:
            raise UserError(f"pool: mode='cls' but {type(encoder).__name__} has no CLS token; "
                            f"use mode='mean' or build the encoder with cls_token=true.")
        if mask is None:
            return memory[:, 0] if mode == "cls" else memory[:, -1]
        # argmax finds the first True (the last one on the reversed mask); left padding too.
        s = memory.shape[1]
        first = mask.int().argmax(dim=1)                                     # (b,)
        index = first if mode == "cls" else s - 1 - mask.flip(1).int().argmax(dim=1)
        return memory[torch.arange(memory.shape[0], device=memory.device), index]
    skip = encoder.num_prefix_tokens if encoder is not None else 0
    memory = memory[:, skip:]
    if mask is None:
        return memory.mean(dim=1)
    weight = mask[:, skip:].to(memory.dtype).unsqueeze(-1)                  # (b, s, 1)
    return (memory * weight).sum(dim=1) / weight.sum(dim=1).clamp_min(1.0)


class Encoder(nn.Module):
    """Base class of mmtf encoders: a common forward signature, pooling, loading and freezing.

    Subclasses set ``self.dim`` (and ``has_cls`` / ``num_prefix_tokens`` if they prepend a CLS
    token), record their constructor values in ``self.config`` and call :meth:`_finish_init` last
    in ``__init__``.

    Freezing sets ``requires_grad=False`` and pins eval mode (``.train()`` on any parent leaves
    it in eval); :meth:`unfreeze` undoes both."""

    dim: int
    has_cls: bool = False
    num_prefix_tokens: int = 0

    def __init__(self) -> None:
        super().__init__()
        self._frozen = False
        self.config: dict[str, Any] = {}

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> EncoderOutput:
        raise NotImplementedError

    # ---------------------------------------------------------------------- pooling
    def pool(self, out: EncoderOutput, mode: PoolMode = "mean") -> Tensor:
        """:func:`pool` over this encoder's output; (b, c)."""
        return pool(out.memory, out.mask, mode, encoder=self)

    # ---------------------------------------------------------------------- freezing
    @property
    def frozen(self) -> bool:
        return self._frozen

    def freeze(self) -> Encoder:
        """No trainable parameters; eval mode that ``.train()`` cannot undo. Returns self."""
        self.requires_grad_(False)
        self._frozen = True
        return super().train(False)

    def unfreeze(self, train: bool = True) -> Encoder:
        """Make every parameter trainable again and set the mode (train by default)."""
        self.requires_grad_(True)
        self._frozen = False
        return super().train(train)

    def train(self, mode: bool = True) -> Encoder:
        # A frozen encoder ignores train(True) from a parent: dropout and SpecAugment stay off.
        return super().train(False if self._frozen else mode)

    # ---------------------------------------------------------------------- loading
    def load_pretrained(self, path: str | Path) -> None:
        """Load ``path/weights.safetensors`` (or a ``.safetensors`` file) into this encoder.

        Keys, shapes, config-derived buffers (the mel filterbank; not learned statistics) and
        settings are compared before anything is copied.

        Raises:
            UserError: no safetensors file, or tensors, buffers or settings that differ; the
                message names them and the config to rebuild with.
        """
        name = type(self).__name__
        export = open_export(path, owner=f"{name}.load_pretrained")
        file, weights = export.weights_file, export.tensors()
        own = self.state_dict()
        problems = [f"tensor {k!r} has shape {tuple(v.shape)} in {file} but "
                    f"{tuple(own[k].shape)} in this model"
                    for k, v in weights.items() if k in own and v.shape != own[k].shape]
        missing = sorted(own.keys() - weights.keys())
        unexpected = sorted(weights.keys() - own.keys())
        if missing:
            problems.append(f"{len(missing)} tensor(s) of this model are missing from {file}: "
                            f"{_clip(missing)}")
        if unexpected:
            problems.append(f"{len(unexpected)} tensor(s) in {file} are not in this model: "
                            f"{_clip(unexpected)}")
        if not problems:
            # Config-derived buffers (mel filterbank, window) that differ mean another front-end
            # config; running statistics and position tables are loaded data, not compared.
            learned = {f"{m_name}.{b_name}" if m_name else b_name
                       for m_name, module in self.named_modules()
                       if isinstance(module, LOADED_BUFFER_MODULES)
                       for b_name, _ in module.named_buffers(recurse=False)}
            buffers = {k for k, _ in self.named_buffers() if k in own and k not in learned}
            problems = [f"buffer {k!r} (computed from the config) differs between {file} and "
                        f"this model" for k in sorted(buffers)
                        if not own[k].is_meta and not torch.allclose(
                            weights[k].to(own[k]), own[k], rtol=1e-4, atol=1e-6)]
        if not problems:
            # Same shapes can still mean another model (hop_length, feature normalisation).
            exported = flatten_parts(export.config())
            differ = sorted(k for k in self.config if k in exported and k not in TUNABLE_KEYS
                            and _plain(exported[k]) != self.config[k])
            problems = [f"config {k}={self.config[k]!r} but the export has {k}="
                        f"{_plain(exported[k])!r}" for k in differ]
        if problems:
            raise UserError(f"{name}.load_pretrained: " + "; ".join(problems[:5])
                            + f"{'; ...' if len(problems) > 5 else ''}. "
                            + self._config_hint(export))
        self.load_state_dict(weights)

    def _config_hint(self, export: ExportFolder) -> str:
        """The fix for a mismatch: which config values differ from the exported ones."""
        cfg_file, exported = export.config_file, flatten_parts(export.config())
        if not exported:
            return ("Build the encoder with the same config it was exported with (model.encoder "
                    "in the training run's .hydra/config.yaml).")
        diffs = [k for k in self.config if k in exported and _plain(exported[k]) != self.config[k]]
        if not diffs:
            return f"Build the encoder with the exported config ({cfg_file})."
        theirs = ", ".join(f"{k}={_plain(exported[k])}" for k in diffs)
        ours = ", ".join(f"{k}={self.config[k]}" for k in diffs)
        return (f"Build the encoder with the exported config ({cfg_file}: {theirs}); this model "
                f"was built with {ours}.")

    # ---------------------------------------------------------------------- construction
    def _finish_init(self, *, pretrained: str | Path | None, freeze: bool, causal: bool) -> None:
        """Last step of every subclass ``__init__``: warn on causal, load weights, freeze."""
        if causal:
            warnings.warn(f"{type(self).__name__} built with causal=True: its self-attention "
                          f"only looks back (streaming research). The front end/patch embedding "
                          f"is unchanged. Remove causal from the config for a normal encoder.",
                          UserWarning, stacklevel=3)
        if pretrained is not None:
            self.load_pretrained(pretrained)
        if freeze:
            self.freeze()


def record_config(local_vars: dict[str, Any]) -> dict[str, Any]:
    """Constructor values (from ``locals()``) as plain Python, minus loading/freezing switches
    and the parts (whose values the caller adds flat, as :func:`mmtf.utils.parts.flatten_parts`)."""
    skip = {"self", "__class__", "pretrained", "freeze", "block", "frontend", "spec_augment",
            "patch", "embedding", "pooling"}
    return {k: _plain(v) for k, v in local_vars.items() if k not in skip}


def _plain(value: Any) -> Any:
    """Lists/tuples (also Hydra's ListConfig) -> list, so config values compare equal."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return value
    return [_plain(v) for v in value]


def _clip(keys: list[str], n: int = 4) -> str:
    return ", ".join(repr(k) for k in keys[:n]) + (", ..." if len(keys) > n else "")
