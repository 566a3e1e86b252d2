"""Projectors: encoder states (b, n, d_enc) + valid mask -> LLM-width embeddings (b, m, d_llm)
+ mask, the bridge of a multimodal prefix model (:class:`mmtf.decoders.prefix.MediaPrefixLM`).

Kinds (:data:`PROJECTORS`, picked by name: ``model.projector.kind=concat model.projector.k=5``):

- ``linear``: one linear layer per frame (m = n).
- ``mlp``: Linear -> GELU -> Linear per frame (LLaVA-1.5's; m = n).
- ``concat``: k consecutive frames concatenated, then the MLP (SLAM-AAC's downsampler); the
  tail is zero-padded to a multiple of k (m = ceil(n / k)).
- ``conv``: Conv1d with kernel = stride = k (m = ceil(n / k), the tail padded likewise).
- ``qformer``: learned queries reading the encoder states through cross-attention blocks of
  the attention core (BLIP-2); with ``window`` w the queries read each window of w frames on
  its own (SALMONN's window-level Q-Former; m = ceil(n / w) * num_queries).
- ``pixel_shuffle``: space-to-depth by a factor s on an image's patch grid, then a linear layer
  (nanoVLM's; m = n / s^2).

Masking: frames where the mask is False are zeroed before they are mixed with others, so their
values never reach the output; an output position is valid when any frame it reads is, and it
is zero where it is not. Why: docs/design/prefix-model.md.

Shapes: b batch, n encoder frames, d = d_enc, m output positions, c = d_llm, k / w frames per
output position or window, q queries, s pixel-shuffle factor.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.nn.linear import Linear
from mmtf.nn.transformer import BlockOptions, TransformerStack


class ProjectorOutput(NamedTuple):
    """What a projector returns.

    Attributes:
        embeds: (b, m, c); zero where ``mask`` is False.
        mask: (b, m) bool, True = a valid position.
    """

    embeds: Tensor
    mask: Tensor


class Projector(nn.Module):
    """Base class: ``forward(x (b, n, d_enc), mask (b, n) bool | None) -> ProjectorOutput``.

    Subclasses set ``in_dim`` and ``out_dim``."""

    in_dim: int
    out_dim: int

    def output_length(self, n: int) -> int:
        """Output positions m of n input frames."""
        return n

    def _inputs(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """``x`` with masked frames zeroed, and the (b, n) bool mask (None = all valid)."""
        if x.dim() != 3 or x.shape[-1] != self.in_dim:
            raise ValueError(f"{type(self).__name__}: encoder states must be (batch, frames, "
                             f"in_dim={self.in_dim}); got shape {tuple(x.shape)}.")
        if mask is None:
            return x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"{type(self).__name__}: mask must be bool of shape "
                             f"{tuple(x.shape[:2])}; got {mask.dtype} {tuple(mask.shape)}.")
        return x.masked_fill(~mask[..., None], 0.0), mask


def _pad_frames(x: Tensor, mask: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Zero-pad the frame axis to a multiple of ``k``: (b, n, d) -> (b, k * ceil(n / k), d)."""
    tail = -x.shape[1] % k
    if tail:
        x = F.pad(x, (0, 0, 0, tail))
        mask = F.pad(mask, (0, tail), value=False)
    return x, mask


def _window_mask(mask: Tensor, k: int) -> Tensor:
    """(b, m * k) -> (b, m): a window is valid when any of its k frames is."""
    return rearrange(mask, "b (m k) -> b m k", k=k).any(dim=-1)


def _finish(y: Tensor, mask: Tensor) -> ProjectorOutput:
    return ProjectorOutput(y.masked_fill(~mask[..., None], 0.0), mask)


def _check_positive(owner: str, **values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{owner}: model.projector.{key} ({value!r}) must be an integer >= 1.")


class LinearProjector(Projector):
    """One linear layer per frame: (b, n, d) -> (b, n, c)."""

    def __init__(self, *, in_dim: int, out_dim: int, bias: bool = True) -> None:
        super().__init__()
        _check_positive("LinearProjector", in_dim=in_dim, out_dim=out_dim)
        self.in_dim, self.out_dim = in_dim, out_dim
        self.proj = Linear(in_dim, out_dim, bias=bias)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> ProjectorOutput:
        x, mask = self._inputs(x, mask)
        return _finish(self.proj(x), mask)                               # (b, n, c)


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    """Linear -> GELU -> Linear, (..., in_dim) -> (..., out_dim)."""
    return nn.Sequential(Linear(in_dim, hidden), nn.GELU(), Linear(hidden, out_dim))


class MLPProjector(Projector):
    """Two layers per frame, Linear -> GELU -> Linear: (b, n, d) -> (b, n, c).

    Args:
        hidden: the hidden width; None = ``out_dim`` (LLaVA-1.5).
    """

    def __init__(self, *, in_dim: int, out_dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = out_dim if hidden is None else hidden
        _check_positive("MLPProjector", in_dim=in_dim, out_dim=out_dim, hidden=hidden)
        self.in_dim, self.out_dim = in_dim, out_dim
        self.mlp = _mlp(in_dim, hidden, out_dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> ProjectorOutput:
        x, mask = self._inputs(x, mask)
        return _finish(self.mlp(x), mask)                                # (b, n, c)


class ConcatProjector(Projector):
    """k consecutive frames concatenated, then the MLP: (b, n, d) -> (b, ceil(n / k), c).

    SLAM-AAC (arXiv:2410.09503) downsamples its encoder this way; it drops the tail, this pads
    it with zero frames (an item's last partial window is valid, so no audio is lost).

    Args:
        k: frames per output position.
        hidden: the MLP's hidden width; None = ``out_dim``.
    """

    def __init__(self, *, in_dim: int, out_dim: int, k: int = 5, hidden: int | None = None,
                 ) -> None:
        super().__init__()
        hidden = out_dim if hidden is None else hidden
        _check_positive("ConcatProjector", in_dim=in_dim, out_dim=out_dim, k=k, hidden=hidden)
        self.in_dim, self.out_dim, self.k = in_dim, out_dim, k
        self.mlp = _mlp(k * in_dim, hidden, out_dim)

    def output_length(self, n: int) -> int:
        return math.ceil(n / self.k)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> ProjectorOutput:
        x, mask = _pad_frames(*self._inputs(x, mask), self.k)
        stacked = rearrange(x, "b (m k) d -> b m (k d)", k=self.k)       # (b, m, k * d)
        return _finish(self.mlp(stacked), _window_mask(mask, self.k))    # (b, m, c)


class ConvProjector(Projector):
    """Conv1d with kernel = stride = k: (b, n, d) -> (b, ceil(n / k), c), the tail zero-padded.

    Args:
        k: frames per output position (kernel and stride).
    """

    def __init__(self, *, in_dim: int, out_dim: int, k: int = 2) -> None:
        super().__init__()
        _check_positive("ConvProjector", in_dim=in_dim, out_dim=out_dim, k=k)
        self.in_dim, self.out_dim, self.k = in_dim, out_dim, k
        self.conv = nn.Conv1d(in_dim, out_dim, kernel_size=k, stride=k)

    def output_length(self, n: int) -> int:
        return math.ceil(n / self.k)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> ProjectorOutput:
        x, mask = _pad_frames(*self._inputs(x, mask), self.k)
        y = self.conv(rearrange(x, "b n d -> b d n"))                    # (b, c, m)
        return _finish(rearrange(y, "b c m -> b m c"), _window_mask(mask, self.k))


class QFormerProjector(Projector):
    """Learned queries that read the encoder states through cross-attention (BLIP-2,
    arXiv:2301.12597): (b, n, d) -> (b, q, c), or with ``window`` w, (b, ceil(n / w) * q, c).

    Each block of the stack is the attention core's: self-attention among the queries (no
    positions: the queries are learned per slot), cross-attention to the encoder states with
    their mask, an MLP. With a window the states are cut into windows of w frames (the tail
    zero-padded and masked) and every window is a row of its own, so its queries see only its
    frames (SALMONN, arXiv:2310.13289); the windows' outputs follow each other in time.

    Args:
        num_queries: q learned queries (per window).
        window: frames per window; None = one window over the whole sequence.
        dim: the Q-Former's width; None = ``in_dim``.
        depth, num_heads, block: its :class:`~mmtf.nn.TransformerStack`.
    """

    def __init__(self, *, in_dim: int, out_dim: int, num_queries: int = 32,
                 window: int | None = None, dim: int | None = None, depth: int = 2,
                 num_heads: int = 4, block: BlockOptions | Mapping[str, Any] | None = None,
                 ) -> None:
        super().__init__()
        dim = in_dim if dim is None else dim
        _check_positive("QFormerProjector", in_dim=in_dim, out_dim=out_dim,
                        num_queries=num_queries, dim=dim, depth=depth, num_heads=num_heads,
                        **({} if window is None else {"window": window}))
        self.in_dim, self.out_dim, self.dim = in_dim, out_dim, dim
        self.num_queries, self.window = num_queries, window
        self.queries = nn.Parameter(torch.empty(num_queries, dim))
        nn.init.normal_(self.queries, std=0.02)
        self.stack = TransformerStack(depth=depth, dim=dim, num_heads=num_heads, block=block,
                                      causal=False, cross_dim=in_dim)
        self.proj = Linear(dim, out_dim)

    def output_length(self, n: int) -> int:
        windows = 1 if self.window is None else math.ceil(n / self.window)
        return windows * self.num_queries

    def forward(self, x: Tensor, mask: Tensor | None = None) -> ProjectorOutput:
        x, mask = self._inputs(x, mask)
        b = x.shape[0]
        w = x.shape[1] if self.window is None else self.window
        x, mask = _pad_frames(x, mask, w)
        frames = rearrange(x, "b (nw w) d -> (b nw) w d", w=w)           # one row per window
        frame_mask = rearrange(mask, "b (nw w) -> (b nw) w", w=w)
        queries = repeat(self.queries, "q c -> r q c", r=frames.shape[0])
        out = self.stack(queries, context=frames, context_mask=frame_mask)  # (b nw, q, dim)
        out = rearrange(self.proj(out), "(b nw) q c -> b (nw q) c", b=b)
        valid = repeat(_window_mask(mask, w), "b nw -> b (nw q)", q=self.num_queries)
        return _finish(out, valid)                                       # (b, nw * q, c)


class PixelShuffleProjector(Projector):
    """Space-to-depth on an image's patch grid, then a linear layer (nanoVLM's modality
    projector): (b, p + h * w, d) -> (b, (h / s) * (w / s), c).

    Each s x s block of patches becomes one position of width s * s * d, the patches of the
    block in row-major order; the leading ``prefix_tokens`` (a ViT's CLS) are dropped.

    Args:
        factor: s; the grid's sides must be multiples of it.
        prefix_tokens: tokens before the grid (the prefix model fills in its encoder's
            ``num_prefix_tokens`` when the config leaves it out).
        grid: the patch grid (h, w); None = square.
        bias: of the linear layer (nanoVLM has none).
    """

    def __init__(self, *, in_dim: int, out_dim: int, factor: int = 2, prefix_tokens: int = 0,
                 grid: tuple[int, int] | None = None, bias: bool = False) -> None:
        super().__init__()
        _check_positive("PixelShuffleProjector", in_dim=in_dim, out_dim=out_dim, factor=factor)
        if prefix_tokens < 0:
            raise UserError(f"PixelShuffleProjector: model.projector.prefix_tokens "
                            f"({prefix_tokens}) must be >= 0.")
        self.in_dim, self.out_dim, self.factor = in_dim, out_dim, factor
        self.prefix_tokens = prefix_tokens
        self.grid = None if grid is None else (int(grid[0]), int(grid[1]))
        self.proj = Linear(factor * factor * in_dim, out_dim, bias=bias)

    def grid_of(self, n: int) -> tuple[int, int]:
        """The patch grid (h, w) of n encoder positions (prefix tokens included).

        Raises:
            UserError: no grid of that size, or sides that are not multiples of the factor.
        """
        patches = n - self.prefix_tokens
        if self.grid is not None:
            h, w = self.grid
        else:
            h = w = math.isqrt(max(patches, 0))
        if h * w != patches or h % self.factor or w % self.factor or patches <= 0:
            raise UserError(f"PixelShuffleProjector: {n} encoder positions - prefix_tokens "
                            f"{self.prefix_tokens} = {patches} patches are no "
                            f"{'x'.join(map(str, self.grid)) if self.grid else 'square'} grid "
                            f"with sides divisible by factor {self.factor}; set "
                            f"model.projector.grid=[h, w] / prefix_tokens, or another factor.")
        return h, w

    def output_length(self, n: int) -> int:
        h, w = self.grid_of(n)
        return (h // self.factor) * (w // self.factor)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> ProjectorOutput:
        x, mask = self._inputs(x, mask)
        h, w = self.grid_of(x.shape[1])
        x, mask = x[:, self.prefix_tokens:], mask[:, self.prefix_tokens:]   # (b, h * w, d)
        s = self.factor
        pattern = "b (ho s1 wo s2) d -> b (ho wo) (s1 s2 d)"
        blocks = rearrange(x, pattern, ho=h // s, s1=s, s2=s)             # (b, m, s * s * d)
        valid = rearrange(mask, "b (ho s1 wo s2) -> b (ho wo) (s1 s2)", ho=h // s, s1=s, s2=s)
        return _finish(self.proj(blocks), valid.any(dim=-1))             # (b, m, c)


PROJECTORS: dict[str, type[Projector]] = {
    "linear": LinearProjector,
    "mlp": MLPProjector,
    "concat": ConcatProjector,
    "conv": ConvProjector,
    "qformer": QFormerProjector,
    "pixel_shuffle": PixelShuffleProjector,
}

ProjectorSpec = Mapping[str, Any] | str | Callable[..., nn.Module] | nn.Module


def build_projector(spec: ProjectorSpec, *, in_dim: int, out_dim: int,
                    prefix_tokens: int = 0) -> Projector | nn.Module:
    """The projector of a config (``model.projector``).

    Args:
        spec: ``{"kind": <name in PROJECTORS>, **its settings}`` or the name alone; a callable
            (a Hydra ``_target_`` with ``_partial_: true``, e.g. one's own class) called with
            ``in_dim`` and ``out_dim``; or a built module (its ``in_dim``/``out_dim``, when it
            has them, must be these).
        in_dim, out_dim: the encoder's and the LLM's widths.
        prefix_tokens: the encoder's leading non-grid tokens (``pixel_shuffle``'s default).

    Raises:
        UserError: an unknown kind or key, or widths that differ from the encoder's / LLM's.
    """
    if isinstance(spec, nn.Module):
        module = spec
    elif isinstance(spec, str | Mapping):
        settings = {"kind": spec} if isinstance(spec, str) else dict(spec)
        kind = settings.pop("kind", None)
        if kind not in PROJECTORS:
            raise UserError(f"model.projector.kind ({kind!r}) must be one of {list(PROJECTORS)} "
                            f"(or give a _target_ with _partial_: true).")
        cls = PROJECTORS[kind]
        allowed = [p for p in inspect.signature(cls).parameters if p not in ("in_dim", "out_dim")]
        unknown = sorted(set(settings) - set(allowed) - {"in_dim", "out_dim"})
        if unknown:
            raise UserError(f"model.projector.{unknown[0]} is not a setting of the {kind} "
                            f"projector; its settings are {allowed}.")
        if kind == "pixel_shuffle" and settings.get("prefix_tokens") is None:
            settings["prefix_tokens"] = prefix_tokens
        dims = {"in_dim": settings.pop("in_dim", in_dim), "out_dim": settings.pop("out_dim", out_dim)}
        _check_dims(dims, in_dim, out_dim)
        module = cls(**dims, **settings)
    elif callable(spec):
        module = spec(in_dim=in_dim, out_dim=out_dim)
    else:
        raise UserError(f"model.projector must be a mapping with a kind, a kind name, or a "
                        f"_target_; got {type(spec).__name__}.")
    _check_dims({k: getattr(module, k, v) for k, v in (("in_dim", in_dim), ("out_dim", out_dim))},
                in_dim, out_dim)
    return module


def _check_dims(dims: Mapping[str, int], in_dim: int, out_dim: int) -> None:
    for key, want, source in (("in_dim", in_dim, "the encoder's dim"),
                              ("out_dim", out_dim, "the LLM's hidden size")):
        if dims[key] != want:
            raise UserError(f"model.projector.{key} ({dims[key]}) != {source} ({want}); leave "
                            f"it out (the prefix model fills it in).")


__all__ = ["PROJECTORS", "ConcatProjector", "ConvProjector", "LinearProjector", "MLPProjector",
           "PixelShuffleProjector", "Projector", "ProjectorOutput", "QFormerProjector",
           "build_projector"]
