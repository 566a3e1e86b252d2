"""LoRA (Hu et al. 2021, arXiv:2106.09685) on every ``TransformerBlock``'s linear projections.

``y = W x + b + (B A dropout(x)) * alpha / r`` (A Kaiming-uniform as PEFT draws it, B zero).
:class:`LoRALinear` *is* an ``nn.Linear``, so name tables and state dicts of the base keep
working; adapters are ``lora_A.<slice>`` / ``lora_B.<slice>``, one per output slice of a fused
projection (``to_kv``: ``k``, ``v``), sharing one dropout mask. Targets (:data:`TARGETS`): ``q``,
``k``, ``v``, ``o``, ``mlp``. Why: docs/design/lora.md"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mmtf.errors import ConfigError
from mmtf.nn.linear import Linear
from mmtf.nn.transformer import TransformerBlock

# Target name -> the projections (relative to a block) and the slices of each that it adapts.
TARGETS: dict[str, tuple[tuple[str, str], ...]] = {
    "q": (("self_attn.to_q", "q"), ("cross_attn.to_q", "q")),
    "k": (("self_attn.to_kv", "k"), ("cross_attn.to_kv", "k")),
    "v": (("self_attn.to_kv", "v"), ("cross_attn.to_kv", "v")),
    "o": (("self_attn.to_out", "o"), ("cross_attn.to_out", "o")),
    "mlp": (("mlp.fc_in", "fc_in"), ("mlp.fc_out", "fc_out")),
}
# The output slices of each projection, in row order: a fused projection has several.
SLICES = {"to_q": ("q",), "to_kv": ("k", "v"), "to_out": ("o",), "fc_in": ("fc_in",),
          "fc_out": ("fc_out",)}
BIAS_MODES = ("none", "all", "lora_only")
# The state-dict key (under a LoRALinear's prefix) that says its weight holds the adapters.
MERGED = "lora_merged"


@dataclass(frozen=True)
class LoRAConfig:
    """The adapters' hyperparameters (``model.lora``).

    Attributes:
        r: rank (> 0). alpha: the scale is ``alpha / r``. dropout: on the adapter's input.
        targets: names from :data:`TARGETS`.
        bias: PEFT's bias option: ``none`` (the bias-free variant: no bias trains, the base
            stays exactly the pretrained model), ``all`` (every bias of the part trains),
            ``lora_only`` (the biases of adapted projections train).
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q", "k", "v", "o", "mlp")
    bias: str = "none"

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise ConfigError(f"model.lora.r ({self.r!r}) must be an integer rank > 0, e.g. 8.")
        if not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha ({self.alpha}) must be > 0 (scale alpha / r).")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout ({self.dropout}) must be in [0, 1).")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise ConfigError(f"model.lora.targets: {unknown or '[]'} names no projection of "
                              f"the attention core; the valid targets are {list(TARGETS)} "
                              f"(mlp = fc_in and fc_out).")
        if self.bias not in BIAS_MODES:
            raise ConfigError(f"model.lora.bias ({self.bias!r}) must be one of {BIAS_MODES}.")

    @property
    def scale(self) -> float:
        return self.alpha / self.r


class _DroppedLowRank(torch.autograd.Function):
    """``B A dropout(x) * scale``, keeping for backward only ``x``, a 1-byte mask and the
    rank-sized ``A dropout(x)``.

    Plain autograd would keep two more input-sized tensors per adapted projection; backward
    rebuilds ``dropout(x)`` from ``x`` and the mask, in forward's autocast dtype. Backward is
    not itself differentiable (a double backward raises). Why: docs/design/lora.md, "Memory"."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, a: Tensor, b: Tensor, scale: float, p: float) -> Tensor:
        keep = torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p)
        u = F.linear(x * keep * (1.0 / (1.0 - p)), a)
        ctx.save_for_backward(x, keep, u, a, b)
        ctx.scale, ctx.p = scale, p
        return F.linear(u, b).mul_(scale)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, keep, u, a, b = ctx.saved_tensors
        dtype, keep_scale = u.dtype, 1.0 / (1.0 - ctx.p)
        g = grad.to(dtype) * ctx.scale
        grad_u = F.linear(g, b.to(dtype).t())
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[2]:
            grad_b = (g.flatten(0, -2).t() @ u.flatten(0, -2)).to(b.dtype)
        if ctx.needs_input_grad[1]:
            h = x.to(dtype) * keep * keep_scale
            grad_a = (grad_u.flatten(0, -2).t() @ h.flatten(0, -2)).to(a.dtype)
        if ctx.needs_input_grad[0]:
            grad_x = (F.linear(grad_u, a.to(dtype).t()) * keep * keep_scale).to(x.dtype)
        return grad_x, grad_a, grad_b, None, None


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` with a low-rank adapter on some slices of its output rows.

    Built by :meth:`wrap` around an existing layer: its ``weight`` and ``bias`` Parameters are
    the layer's own (same objects, same names), the adapters are added beside them.

    Args:
        in_features, out_features, bias: as ``nn.Linear``.
        slices, adapted: names of the output slices in row order (``("k", "v")`` for ``to_kv``;
            the rows split evenly among them) and the ones that get an adapter.
        r, alpha, dropout: as in :class:`LoRAConfig`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 slices: Sequence[str], adapted: Iterable[str], r: int, alpha: float,
                 dropout: float = 0.0, device: torch.device | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if out_features % len(slices):
            raise ValueError(f"LoRALinear: {out_features} rows do not split into {slices}.")
        self.slices = tuple(slices)
        self.width = out_features // len(slices)
        self.r, self.alpha, self.scale = r, alpha, alpha / r
        self.dropout = float(dropout)
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        kw = {"device": self.weight.device, "dtype": self.weight.dtype}
        adapted = set(adapted)
        for name in self.slices:
            if name in adapted:
                self.lora_A[name] = nn.Parameter(torch.empty(r, in_features, **kw))
                self.lora_B[name] = nn.Parameter(torch.zeros(self.width, r, **kw))
        self.merged = False
        # merge's copy of the base weight, which unmerge restores bit for bit (not saved)
        self.register_buffer("unmerged_weight", None, persistent=False)
        self.reset_lora()

    @classmethod
    def wrap(cls, layer: nn.Linear, *, slices: Sequence[str], adapted: Iterable[str], r: int,
             alpha: float, dropout: float = 0.0) -> LoRALinear:
        """A LoRALinear holding ``layer``'s own Parameters (not copies) plus the adapters."""
        new = cls(layer.in_features, layer.out_features, layer.bias is not None, slices=slices,
                  adapted=adapted, r=r, alpha=alpha, dropout=dropout,
                  device=layer.weight.device, dtype=layer.weight.dtype)
        new.weight = layer.weight
        new.bias = layer.bias
        new.train(layer.training)
        return new

    def reset_lora(self) -> None:
        """PEFT's init: A Kaiming-uniform (a = sqrt(5), nn.Linear's), B zero."""
        for name, a in self.lora_A.items():
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B[name])

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, lora r={self.r}, alpha={self.alpha}, "
                f"adapted={list(self.lora_A)} of {list(self.slices)}, merged={self.merged}")

    def low_rank(self) -> tuple[Tensor, Tensor]:
        """Every adapter of the projection as one low-rank pair ``(A, B)``: A (n r, in) stacks
        the n adapted slices' A, B (out, n r) is block-diagonal (slice i's rows hold its B in
        columns i r .. (i + 1) r, a slice without an adapter zeros), so ``B A`` is every
        slice's ``B_i A_i`` in its rows and one pair of GEMMs computes them all."""
        names = [s for s in self.slices if s in self.lora_A]
        if len(self.slices) == 1:
            return self.lora_A[names[0]], self.lora_B[names[0]]
        a = torch.cat([self.lora_A[s] for s in names]) if len(names) > 1 else \
            self.lora_A[names[0]]
        n, r = len(names), self.r
        rows = [F.pad(self.lora_B[s], (names.index(s) * r, (n - 1 - names.index(s)) * r))
                if s in self.lora_B else a.new_zeros(self.width, n * r) for s in self.slices]
        return a, torch.cat(rows)

    def delta(self) -> Tensor:
        """The adapters' weight ``B A * alpha / r`` as one (out, in) matrix (zero rows where a
        slice has none)."""
        if not self.lora_A:
            return self.weight.new_zeros(self.out_features, self.in_features)
        a, b = self.low_rank()
        return b @ a * self.scale

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.merged or not self.lora_A:
            return y
        a, b = self.low_rank()
        # In place: the base GEMM keeps nothing of its output for backward, and an
        # out-of-place sum would hold three output-sized tensors at once.
        if self.training and self.dropout > 0:
            return y.add_(_DroppedLowRank.apply(x, a, b, self.scale, self.dropout))
        return y.add_(F.linear(F.linear(x, a), b), alpha=self.scale)

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the adapters into ``weight`` (inference: one GEMM, as the base). A copy of the
        base weight is kept until :meth:`unmerge` (memory: one more weight per projection;
        :func:`strip_lora` keeps none)."""
        if not self.merged:
            self.unmerged_weight = self.weight.detach().clone()
            self.weight.add_(self.delta().to(self.weight.dtype))
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Take the adapters back out of ``weight``: the base weight bit for bit (in bf16 too,
        where subtracting them again would not give it back), or, after loading a state saved
        merged (no copy), ``weight - B A * alpha / r``, exact up to rounding."""
        if self.merged:
            if self.unmerged_weight is not None:
                self.weight.copy_(self.unmerged_weight)
            else:
                self.weight.sub_(self.delta().to(self.weight.dtype))
            self.unmerged_weight = None
            self.merged = False

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.merged:          # the weight holds the adapters: a loader must not add them again
            destination[prefix + MERGED] = torch.tensor(True)

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str,
                              local_metadata: dict[str, Any], strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if prefix + MERGED in unexpected_keys:   # the flag is a key of ours
            unexpected_keys.remove(prefix + MERGED)
        if prefix + "weight" in state_dict:      # the flag goes with the weight it describes
            self.merged = bool(state_dict.get(prefix + MERGED, False))
            self.unmerged_weight = None

    def to_linear(self) -> Linear:
        """A plain :class:`~mmtf.nn.linear.Linear` with the merged weight (the adapters
        dropped)."""
        out = Linear(self.in_features, self.out_features, self.bias is not None,
                     device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(self.weight if self.merged else self.weight + self.delta())
            if self.bias is not None:
                out.bias.copy_(self.bias)
        out.train(self.training)
        return out


def lora_sites(module: nn.Module, targets: Iterable[str]) -> dict[str, set[str]]:
    """``{projection path in module: slices to adapt}`` for ``targets`` in every block of
    ``module`` (a block's missing cross-attention is skipped)."""
    sites: dict[str, set[str]] = {}
    names = dict(module.named_modules())
    for block_name, block in names.items():
        if not isinstance(block, TransformerBlock):
            continue
        for target in targets:
            for rel, slice_name in TARGETS[target]:
                path = f"{block_name}.{rel}" if block_name else rel
                if isinstance(names.get(path), nn.Linear):
                    sites.setdefault(path, set()).add(slice_name)
    return sites


def add_lora(module: nn.Module, config: LoRAConfig, *, owner: str = "module",
             sites: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """Replace the targeted projections of ``module`` by :class:`LoRALinear` (in place) and
    return their paths.

    Args:
        module: any module holding TransformerBlocks (an encoder, a decoder, a stack).
        config: rank, scale, dropout and targets.
        owner: the config key named in messages (``model.encoder``).
        sites: exact ``{projection path: slices}`` to adapt instead of ``config.targets`` (a
            PEFT folder's modules).

    Raises:
        ConfigError: ``module`` has no projection that the targets name (the valid targets
            are listed).
    """
    sites = {k: set(v) for k, v in (sites if sites is not None
                                    else lora_sites(module, config.targets)).items()}
    if not sites:
        raise ConfigError(f"model.lora: {owner} ({type(module).__name__}) has no transformer "
                          f"linear layer for the targets {list(config.targets)}; LoRA adapts "
                          f"the projections {list(TARGETS)} of transformer blocks: remove "
                          f"{owner.rsplit('.', 1)[-1]} from model.lora.parts.")
    for path, adapted in sites.items():
        parent_name, _, child = path.rpartition(".")
        parent = module.get_submodule(parent_name)
        layer = getattr(parent, child)
        if isinstance(layer, LoRALinear):
            raise ConfigError(f"model.lora: {owner}.{path} already has an adapter.")
        slices = SLICES.get(child, (child,))
        setattr(parent, child, LoRALinear.wrap(layer, slices=slices, adapted=adapted,
                                               r=config.r, alpha=config.alpha,
                                               dropout=config.dropout))
    return sorted(sites)


def lora_layers(module: nn.Module) -> dict[str, LoRALinear]:
    """Every adapted projection of ``module`` by its path."""
    return {name: m for name, m in module.named_modules() if isinstance(m, LoRALinear)}


def has_lora(module: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in module.modules())


def lora_trainable(module: nn.Module, bias: str = "none") -> list[nn.Parameter]:
    """The parameters LoRA trains in ``module``: every adapter, and the biases ``bias`` asks for
    (:class:`LoRAConfig`; ``lora_only``: PEFT's, the bias of each adapted module, Whisper's
    ``v_bias`` kept apart from the fused ``to_kv`` included)."""
    params = []
    for m in module.modules():
        if isinstance(m, LoRALinear):
            params += [*m.lora_A.values(), *m.lora_B.values()]
            if bias == "lora_only" and m.bias is not None:
                params.append(m.bias)
        kv = getattr(m, "to_kv", None)
        if bias == "lora_only" and isinstance(kv, LoRALinear):
            params += [b for s in kv.lora_A if (b := getattr(m, f"{s}_bias", None)) is not None]
    if bias == "all":
        params += [p for name, p in module.named_parameters() if name.endswith("bias")]
    return params


def merge_lora(module: nn.Module) -> None:
    """Fold every adapter of ``module`` into its weight (:meth:`LoRALinear.merge`)."""
    for layer in lora_layers(module).values():
        layer.merge()


def unmerge_lora(module: nn.Module) -> None:
    """Undo :func:`merge_lora`."""
    for layer in lora_layers(module).values():
        layer.unmerge()


def strip_lora(module: nn.Module) -> None:
    """Replace every LoRALinear by a plain ``nn.Linear`` with the merged weight, so the module
    is the base architecture again (``format=hf merge_lora=true``)."""
    for path, layer in lora_layers(module).items():
        parent_name, _, child = path.rpartition(".")
        setattr(module.get_submodule(parent_name), child, layer.to_linear())


# The attribute a pretrained builder sets on a part: the names of the parameters it left at a
# fresh initialisation (no original in the folder), which train alongside the adapters.
NEW_PARAMETERS = "new_parameters"


def mark_new(module: nn.Module, names: Iterable[str]) -> None:
    """Record that ``module``'s parameters ``names`` are new (not imported): under LoRA they
    train in full, as PEFT's ``modules_to_save``."""
    setattr(module, NEW_PARAMETERS, frozenset(names) | new_parameter_names(module))


def new_parameter_names(module: nn.Module) -> frozenset[str]:
    """The names :func:`mark_new` recorded on ``module`` (empty when all were imported or the
    module was built without a pretrained folder)."""
    return getattr(module, NEW_PARAMETERS, frozenset())
