"""Vision encoder: a ViT (Dosovitskiy et al. 2021, arXiv:2010.11929) on the shared attention core.

Patches come from one Conv2d (``stem="patch"``) or a convolutional stem of stride-2 3x3
convolutions (``stem="conv"``; Xiao et al. 2021, arXiv:2106.14881); an optional CLS token is
prepended and a bidirectional ``TransformerStack`` runs over the sequence. Positions are added
to the patch tokens only (an imported CLS position is folded into the token): fixed 2-D
sine-cosine (``sincos``) or a learned table on the ``image_size`` grid, resampled bicubically
for other sizes as Hugging Face's ``interpolate_pos_encoding`` does. Why both, and why not RoPE:
docs/design/vision-stem-and-positions.md.

Hugging Face ViT and CLIP towers are this class configured; their builders
(:mod:`mmtf.pretrained.vit`, :mod:`mmtf.pretrained.clip`) read the folders, this class loads only
mmtf exports. Inputs are normalised float images; every position is valid (mask all True).

Shapes: b batch, gh gw patch-grid height/width, p = gh * gw patches, s = p (+1 with CLS), c = dim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from mmtf.encoders.base import Encoder, EncoderOutput, record_config
from mmtf.errors import UserError, in_config
from mmtf.nn import TransformerStack
from mmtf.nn.transformer import AttentionLayers, AttentionMaps, BlockOptions, make_norm
from mmtf.utils.parts import as_part


@dataclass(frozen=True)
class PatchOptions:
    """How images become patch tokens (``model.encoder.patch``; the module is ``patch_embed``).

    Args:
        patch_size, in_channels: side of the square patches in pixels; image channels.
        stem: "patch" (one Conv2d, as ViT) or "conv" (stride-2 3x3 convolutions with norm and
            GELU, then a 1x1 projection; patch_size must be a power of two).
        stem_convs: 3x3 convolutions per resolution of the conv stem (the first one strided).
        stem_norm: "batch" (BatchNorm2d; per-rank under DDP unless ``trainer.sync_batchnorm``)
            or "layer" (per-pixel LayerNorm: batch-independent, for tiny batches).
        patch_bias: the ``stem="patch"`` convolution has a bias (ViT) or not (CLIP).
    """

    patch_size: int = 8
    in_channels: int = 3
    stem: Literal["patch", "conv"] = "patch"
    stem_convs: int = 1
    stem_norm: Literal["batch", "layer"] = "batch"
    patch_bias: bool = True


class VisionEncoder(Encoder):
    """Images (b, in_channels, H, W) -> memory (b, s, c), mask (b, s) all True.

    Args:
        dim, depth, num_heads, block, final_norm: the transformer (see
            :class:`mmtf.nn.TransformerStack`; ``block.norm`` also for ``embed_norm``).
        patch: patch size, channels and stem (:class:`PatchOptions`, or a mapping of fields).
        image_size: size of the position table's grid, ``H`` or ``(H, W)``; other multiples of
            ``patch_size`` are accepted and use an interpolated table.
        cls_token: prepend a learned CLS token (position 0 of the memory; ``pool(mode="cls")``).
        pos_embed: "learned" (a trained table on the ``image_size`` grid) or "sincos" (fixed 2-D
            sine-cosine; dim must be a multiple of 4).
        embed_norm: a norm before the first block (CLIP's ``pre_layrnorm``).
        causal: causal self-attention over the patch order (research only; warns).
        activation_checkpointing, pretrained, freeze: as :class:`~mmtf.encoders.AudioEncoder`.
    """

    def __init__(self, *, dim: int = 128, depth: int = 4, num_heads: int = 4,
                 block: BlockOptions | Mapping[str, Any] | None = None,
                 patch: PatchOptions | Mapping[str, Any] | None = None,
                 image_size: int | Sequence[int] = 64, cls_token: bool = True,
                 pos_embed: Literal["learned", "sincos"] = "learned", embed_norm: bool = False,
                 final_norm: bool = True, causal: bool = False,
                 activation_checkpointing: bool = False, pretrained: str | Path | None = None,
                 freeze: bool = False) -> None:
        super().__init__()
        block, patch = as_part(BlockOptions, block), as_part(PatchOptions, patch)
        self.config = record_config({**locals(), **asdict(block), **asdict(patch)})
        patch_size, in_channels, stem = patch.patch_size, patch.in_channels, patch.stem
        if patch_size < 1 or in_channels < 1:
            raise UserError(f"VisionEncoder: patch_size ({patch_size}) and in_channels "
                            f"({in_channels}) must be >= 1; fix model.encoder.patch.")
        height, width = _pair(image_size)
        if height < patch_size or width < patch_size or height % patch_size or width % patch_size:
            raise UserError(f"VisionEncoder: image_size ({height}, {width}) must be a positive "
                            f"multiple of patch_size ({patch_size}); change "
                            f"model.encoder.image_size or model.encoder.patch.patch_size.")
        self.dim, self.patch_size, self.in_channels = dim, patch_size, in_channels
        self.grid = (height // patch_size, width // patch_size)
        self.has_cls, self.num_prefix_tokens = cls_token, int(cls_token)
        if stem not in ("patch", "conv"):
            raise UserError(f"VisionEncoder: stem ({stem!r}) must be 'patch' or 'conv'; fix "
                            f"model.encoder.patch.stem.")
        if stem == "conv" and patch_size & (patch_size - 1):
            raise UserError(f"VisionEncoder: stem 'conv' halves the image log2(patch_size) "
                            f"times, so patch_size ({patch_size}) must be a power of two; use "
                            f"stem: patch or change model.encoder.patch.patch_size.")
        if patch.stem_convs < 1 or patch.stem_norm not in ("batch", "layer"):
            raise UserError(f"VisionEncoder: stem_convs ({patch.stem_convs}) must be >= 1 and "
                            f"stem_norm ({patch.stem_norm!r}) 'batch' or 'layer'; fix "
                            f"model.encoder.patch.")
        # Channels-last through the conv stem: oneDNN's NHWC kernels are faster, and the
        # flatten to tokens below becomes a view instead of a copy.
        self.channels_last = stem == "conv"
        self.patch_embed = (conv_stem(in_channels, dim, patch_size, convs=patch.stem_convs,
                                      norm=patch.stem_norm) if stem == "conv" else
                            nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size,
                                      bias=patch.patch_bias))
        if pos_embed not in ("learned", "sincos"):
            raise UserError(f"VisionEncoder: pos_embed ({pos_embed!r}) must be 'learned' or "
                            f"'sincos'; fix model.encoder.pos_embed.")
        if pos_embed == "sincos" and dim % 4:
            raise UserError(f"VisionEncoder: pos_embed 'sincos' splits dim ({dim}) into 4 "
                            f"equal parts (sin/cos of row and column); use a dim divisible by "
                            f"4 or pos_embed: learned.")
        self.pos_embed: nn.Parameter | None = None
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.empty(1, self.grid[0] * self.grid[1], dim))
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.cls_token = None
        if cls_token:
            self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.embed_norm = make_norm(block.norm, dim, block.norm_eps) if embed_norm else None
        with in_config("model.encoder"):     # the stack and Attention own their rules
            self.stack = TransformerStack(
                depth=depth, dim=dim, num_heads=num_heads, block=block, causal=causal,
                rope=False, final_norm=final_norm,
                activation_checkpointing=activation_checkpointing)
        self.drop = nn.Dropout(block.dropout)    # after the stack: it checks dropout
        self._finish_init(pretrained=pretrained, freeze=freeze, causal=causal)

    def position_table(self, gh: int, gw: int) -> Tensor:
        """Position embeddings for a (gh, gw) grid, (1, gh * gw, c): sine-cosine of the grid, or
        the learned table as is at its own grid, bicubically resampled (in float32) at any other,
        exactly as Hugging Face's ``interpolate_pos_encoding``."""
        if self.pos_embed is None:
            device = next(self.patch_embed.parameters()).device
            return sincos_2d(gh, gw, self.dim, device=device)[None]
        if (gh, gw) == self.grid:
            return self.pos_embed
        table = rearrange(self.pos_embed, "1 (gh gw) c -> 1 c gh gw", gh=self.grid[0])
        # No antialias: that kernel is PIL's bicubic (a = -0.5), not the a = -0.75 one the
        # imported ViT/CLIP towers were fine-tuned with at other resolutions.
        table = F.interpolate(table.float(), size=(gh, gw), mode="bicubic", align_corners=False)
        return rearrange(table, "1 c gh gw -> 1 (gh gw) c").to(self.pos_embed.dtype)

    def forward(self, inputs: Tensor, lengths: Tensor | None = None, *,
                attention_layers: AttentionLayers | None = None,
                ) -> EncoderOutput | tuple[EncoderOutput, AttentionMaps]:
        """Encode a batch of images.

        Args:
            inputs: (b, in_channels, H, W) float, H and W multiples of ``patch_size``.
            lengths: ignored (every patch is valid).
            attention_layers: as :meth:`~mmtf.encoders.AudioEncoder.forward`.

        Returns:
            EncoderOutput: memory (b, s, c), s = (H / patch) * (W / patch) (+1 with CLS first);
            mask (b, s) all True. With ``attention_layers`` also ``{"self": {layer: (b, h, s,
            s)}}``.
        """
        self._check_inputs(inputs)
        dtype = next(self.patch_embed.parameters()).dtype
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        x = self.patch_embed(inputs.to(dtype, memory_format=memory_format))  # (b, c, gh, gw)
        gh, gw = x.shape[-2:]
        x = rearrange(x, "b c gh gw -> b (gh gw) c") + self.position_table(gh, gw).to(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)   # (b, s, c)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        maps = None
        if attention_layers is None:
            x = self.stack(self.drop(x))
        else:
            x, maps = self.stack(self.drop(x), attention_layers=attention_layers)
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        return EncoderOutput(x, mask) if maps is None else (EncoderOutput(x, mask), maps)

    def _check_inputs(self, images: Tensor) -> None:
        if images.dim() != 4 or images.shape[1] != self.in_channels:
            raise ValueError(f"VisionEncoder: inputs must be (batch, {self.in_channels}, H, W), "
                             f"got {tuple(images.shape)}; check the data transforms or "
                             f"model.encoder.patch.in_channels.")
        if not images.is_floating_point():
            raise ValueError(f"VisionEncoder: inputs must be float images, got {images.dtype}; "
                             f"convert with transforms.v2.ToDtype(torch.float32, scale=True).")
        h, w = images.shape[-2:]
        p = self.patch_size
        if h < p or w < p or h % p or w % p:
            raise UserError(f"VisionEncoder: image size ({h}, {w}) must be divisible by "
                            f"patch_size ({p}); resize or pad the images (data transforms) or "
                            f"change model.encoder.patch.patch_size.")


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of each pixel, (b, c, h, w) -> (b, c, h, w): local, unlike
    GroupNorm (whole-image statistics), and independent of the batch, unlike BatchNorm."""

    def forward(self, x: Tensor) -> Tensor:
        x = rearrange(x, "b c h w -> b h w c")
        return rearrange(super().forward(x), "b h w c -> b c h w")


def conv_stem(in_channels: int, dim: int, patch_size: int, *, convs: int = 1,
              norm: Literal["batch", "layer"] = "batch") -> nn.Sequential:
    """log2(patch_size) stages of ``convs`` 3x3 convs (the first stride 2; widths doubling up to
    ``dim``), each with a norm and GELU, + a 1x1 projection:
    (b, in_channels, H, W) -> (b, dim, H / patch_size, W / patch_size)."""
    steps = patch_size.bit_length() - 1
    layers: list[nn.Module] = []
    channels = in_channels
    for i in range(steps):
        width = max(16, dim // 2 ** (steps - 1 - i))
        for j in range(convs):
            layers += [nn.Conv2d(channels, width, 3, stride=2 if j == 0 else 1, padding=1,
                                 bias=False),
                       nn.BatchNorm2d(width) if norm == "batch" else LayerNorm2d(width),
                       nn.GELU()]
            channels = width
    layers.append(nn.Conv2d(channels, dim, kernel_size=1))
    return nn.Sequential(*layers)


def sincos_2d(gh: int, gw: int, dim: int, *, temperature: float = 10000.0,
              device: torch.device | None = None) -> Tensor:
    """Fixed 2-D position embeddings, (gh * gw, dim) float32 in row-major patch order: channels
    [sin(row w), cos(row w), sin(col w), cos(col w)] over dim / 4 frequencies
    w_k = temperature^(-k / (dim / 4))."""
    quarter = dim // 4
    omega = temperature ** -(torch.arange(quarter, dtype=torch.float64, device=device) / quarter)
    rows, cols = torch.meshgrid(torch.arange(gh, dtype=torch.float64, device=device),
                                torch.arange(gw, dtype=torch.float64, device=device),
                                indexing="ij")
    r = rows.reshape(-1, 1) * omega                                        # (gh * gw, quarter)
    c = cols.reshape(-1, 1) * omega
    return torch.cat([r.sin(), r.cos(), c.sin(), c.cos()], dim=1).float()  # (gh * gw, dim)


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    """``64`` or ``(64, 96)`` (Hydra: ListConfig) -> (height, width)."""
    if isinstance(size, int):
        return size, size
    values = [int(v) for v in size]
    if len(values) != 2:
        raise UserError(f"VisionEncoder: image_size ({values}) must be an int or [height, "
                        f"width]; fix model.encoder.image_size.")
    return values[0], values[1]
