"""The attention behind one generated caption, read from the model's own explicit path.

:func:`caption_attention` generates normally, then teacher-forces ``[bos] + caption`` once with
``attention_layers`` set; row t of a cross-attention map is the query that produced token t.

Shapes: h heads, n caption tokens (eos included), m memory positions (frames or patches)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from mmtf.errors import UserError


@dataclass
class CaptionAttention:
    """One input's caption and the attention maps that produced it (batch axis removed).

    Attributes:
        tokens: (n,) generated ids without bos; eos-terminated unless the length limit hit.
        caption: the decoded caption.
        logits: (n, v) teacher-forced logits of the inspection pass; row t scores token t.
        cross: {layer: (h, n, m)} decoder cross-attention over the encoder memory.
        memory_mask: (m,) bool, True = a valid memory position (audio padding is False).
        decoder_self: {layer: (h, n, n)} decoder self-attention, causal.
        encoder_self: {layer: (h, m, m)} encoder self-attention.
        ended: whether the caption ended with eos (then the last row produced eos).
    """

    tokens: Tensor
    caption: str
    logits: Tensor
    cross: dict[int, Tensor]
    memory_mask: Tensor
    decoder_self: dict[int, Tensor] = field(default_factory=dict)
    encoder_self: dict[int, Tensor] = field(default_factory=dict)
    ended: bool = True

    @property
    def text_tokens(self) -> list[int]:
        """The caption's ids without the closing eos."""
        ids = self.tokens.tolist()
        return ids[:-1] if self.ended else ids


def layer_indices(layers: Sequence[int] | None, depth: int, what: str) -> list[int]:
    """``layers`` as sorted non-negative indices (None = all ``depth``); -1 is the last.

    Raises:
        UserError: an index outside ``[-depth, depth)``, naming ``what`` (the config key).
    """
    if layers is None:
        return list(range(depth))
    out = set()
    for layer in layers:
        if not -depth <= int(layer) < depth:
            raise UserError(f"{what}: layer {layer} is outside [{-depth}, {depth}) for a model "
                            f"of depth {depth}; pick layers 0..{depth - 1} (-1 = last).")
        out.add(int(layer) % depth)
    return sorted(out)


@torch.no_grad()
def caption_attention(model: nn.Module, inputs: Tensor, lengths: Tensor | None, tokenizer, *,
                      cross_layers: Sequence[int] | None = None,
                      decoder_self_layers: Sequence[int] = (),
                      encoder_self_layers: Sequence[int] = (),
                      generation: dict | None = None) -> CaptionAttention:
    """Generate a caption for one input and collect the attention of the chosen layers.

    Runs in eval mode (every submodule's state restored after) and draws no random numbers.

    Args:
        inputs, lengths: a batch of 1: waveform (1, samples) or image (1, 3, H, W); (1,) valid
            samples, or None.
        cross_layers: decoder layers whose cross-attention to return (None = all).
        decoder_self_layers, encoder_self_layers: self-attention layers to return as well.
        generation: options of ``EncoderDecoder.generate`` (default greedy; no sampling).
    """
    if inputs.shape[0] != 1:
        raise ValueError(f"caption_attention: one input at a time (batch of 1), got a batch of "
                         f"{inputs.shape[0]}.")
    options = {"strategy": "greedy", **(generation or {})}
    if options.get("strategy") == "sample":
        raise UserError("generation.strategy=sample: inspection needs a reproducible caption; "
                        "use greedy or beam.")
    options["num_return_sequences"] = 1
    decoder, encoder = model.decoder, model.encoder
    cross = layer_indices(cross_layers, decoder.depth, "layers")
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        generated = model.generate(inputs, lengths, **options).tokens[0]     # (t,)
        tokens = _trim(generated, model.eos_id, model.pad_id)                # (n,)
        if encoder_self_layers:
            out, enc_maps = encoder(inputs, lengths=lengths,
                                    attention_layers={"self": list(encoder_self_layers)})
        else:
            out, enc_maps = encoder(inputs, lengths=lengths), {}
        mask = out.mask if out.mask is not None else torch.ones(
            out.memory.shape[:2], dtype=torch.bool, device=out.memory.device)
        prompt = torch.tensor([model.prompt_ids], dtype=torch.long, device=tokens.device)
        queries = torch.cat([prompt, tokens[None, :-1]], dim=1)              # (1, p - 1 + n)
        request = {"cross": cross, "self": list(decoder_self_layers)}
        logits, maps = decoder(queries, out.memory, mask, attention_layers=request)
        # Keep the rows (and self-attention keys) of the generated tokens; a prompt longer than
        # bos is not shown.
        skip = prompt.shape[1] - 1
        logits = logits[:, skip:]
        maps = {kind: {layer: m[:, :, skip:, skip:] if kind == "self" else m[:, :, skip:]
                       for layer, m in by_layer.items()} for kind, by_layer in maps.items()}
    finally:
        for module, training in modes.items():
            module.training = training
    ids = tokens.tolist()
    ended = bool(ids) and ids[-1] == model.eos_id
    caption = tokenizer.decode(ids[:-1] if ended else ids)
    return CaptionAttention(
        tokens=tokens.cpu(), caption=caption, logits=logits[0].float().cpu(),
        cross={k: v[0].float().cpu() for k, v in maps["cross"].items()},
        memory_mask=mask[0].cpu(),
        decoder_self={k: v[0].float().cpu() for k, v in maps["self"].items()},
        encoder_self={k: v[0].float().cpu() for k, v in enc_maps.get("self", {}).items()},
        ended=ended)


def _trim(tokens: Tensor, eos_id: int, pad_id: int) -> Tensor:
    """Generated ids up to and including the first eos (padding after it dropped), (n,)."""
    ids = tokens.tolist()
    if eos_id in ids:
        return tokens[: ids.index(eos_id) + 1]
    keep = len(ids)
    while keep and ids[keep - 1] == pad_id:
        keep -= 1
    if keep == 0:
        raise RuntimeError("caption_attention: generation returned no token")
    return tokens[:keep]
