"""A ViT or CLIP + GPT-2 captioner written as ``VisionEncoderDecoderModel`` saves it
(``format=hf``): tower under ``encoder.``, GPT-2 with cross-attention under ``decoder.``, then
imported back and compared. The builders read their halves back from the same folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmtf.errors import UserError
from mmtf.pretrained import clip, gpt2, vit
from mmtf.pretrained.vision import ENCODER_DECODER


def export_hf(task: Any, out: Path) -> None:
    """Write the task's ViT/CLIP + GPT-2 pair as one ``VisionEncoderDecoderModel`` folder:
    ``config.json``, ``generation_config.json``, ``model.safetensors`` and GPT-2's tokenizer.

    Raises:
        UserError: the encoder is in neither ViT's nor CLIP's configuration, the decoder is not
            GPT-2-shaped, or the tokenizer is not a pretrained one.
    """
    encoder, decoder = task.model.encoder, task.model.decoder
    tokenizer = gpt2.pretrained_tokenizer(task)
    family, builder = _vision_family(encoder)
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
           "pad_token_id": tokenizer.pad_id, "decoder_start_token_id": tokenizer.prompt_ids[0]}
    gpt2_config = gpt2.hf_config(decoder, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                                 pad_id=tokenizer.pad_id)
    config = {"model_type": ENCODER_DECODER, "architectures": ["VisionEncoderDecoderModel"],
              "encoder": family.hf_config(encoder),
              "decoder": {**gpt2_config, "is_decoder": True}, "is_encoder_decoder": True,
              "tie_word_embeddings": False, **ids}
    tensors = {**family.hf_state_dict(encoder, "encoder."),
               **{f"decoder.{k}": v for k, v in gpt2.hf_state_dict(decoder).items()}}
    gpt2.write_hf_folder(out, config, ids, tensors, tokenizer, decoder)
    gpt2.check_decoder_back(task, out)
    sizes = dict.fromkeys(("dim", "depth", "num_heads", "mlp_ratio", "mlp", "norm_eps",
                           "patch_size", "in_channels", "image_size"))
    if family is vit:
        sizes["bias"] = None
    gpt2.check_same(encoder, builder(pretrained=out, **sizes), out, "encoder")
    print(f"Exported the {config['encoder']['architectures'][0]} + GPT-2 captioner "
          f"(VisionEncoderDecoderModel), {sum(t.numel() for t in tensors.values()):,} values, "
          f"to {out}/")


def _vision_family(encoder: Any) -> tuple[Any, Any]:
    """The family module whose Hugging Face layout a ``VisionEncoder`` is in, and its builder.

    Raises:
        UserError: neither (the settings that differ from each are named).
    """
    problems = []
    for family, builder in ((vit, vit.vit_encoder), (clip, clip.clip_vision_encoder)):
        try:
            family.hf_config(encoder)
        except (UserError, AttributeError) as err:
            problems.append(str(err))
            continue
        return family, builder
    raise UserError(f"export format=hf: the encoder is in neither ViT's nor CLIP's "
                    f"configuration ({'; '.join(problems)}); export it with format=mmtf "
                    f"part=encoder.")
