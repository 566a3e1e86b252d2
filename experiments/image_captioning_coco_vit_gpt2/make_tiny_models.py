"""Write random-weight tiny ViT and GPT-2 folders in the Hugging Face layout (never downloaded),
to run image_captioning_coco_vit_gpt2 end to end on a machine without the real weights.

    python experiments/image_captioning_coco_vit_gpt2/make_tiny_models.py OUT

writes OUT/vit (ViTModel: config.json, model.safetensors, preprocessor_config.json; 2 layers,
width 64, 32x32 images, 8-pixel patches) and OUT/gpt2 (GPT2LMHeadModel without cross-attention:
config.json, model.safetensors, and a byte-level BPE tokenizer trained with `tokenizers` on the
built-in shape captions, saved as tokenizer.json + vocab.json/merges.txt +
tokenizer_config.json, <|endoftext|> as bos = eos = unk as in GPT-2). Then prints the overrides
that point the experiment at them. Needs transformers (pip install 'mmtf[dev]').
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer

ENDOFTEXT = "<|endoftext|>"
WIDTH, DEPTH, HEADS = 64, 2, 4
# Words of the built-in shapes set (mmtf.synthetic.image) and a few more, to learn merges on.
CORPUS = ["a red circle on the left of a blue square", "a green triangle above a yellow star",
          "two small purple squares below an orange circle", "a large white cross at the top",
          "a cyan diamond to the right of a gray triangle", "three shapes in a row"] * 20


def write_vit(folder: Path) -> None:
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    config = ViTConfig(hidden_size=WIDTH, num_hidden_layers=DEPTH, num_attention_heads=HEADS,
                       intermediate_size=2 * WIDTH, image_size=32, patch_size=8)
    ViTModel(config, add_pooling_layer=False).save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)


def write_gpt2(folder: Path) -> int:
    """The GPT-2 folder; returns its vocabulary size."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(CORPUS, vocab_size=320, min_frequency=2,
                                  special_tokens=[ENDOFTEXT], show_progress=False)
    tokenizer.save(str(folder / "tokenizer.json"))
    tokenizer.save_model(str(folder))                                 # vocab.json, merges.txt
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT,
         "model_max_length": 64, "tokenizer_class": "GPT2Tokenizer"}))
    vocab = tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id(ENDOFTEXT)
    config = GPT2Config(vocab_size=vocab, n_positions=64, n_embd=WIDTH, n_layer=DEPTH,
                        n_head=HEADS, bos_token_id=eos, eos_token_id=eos)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return vocab


def overrides(out: Path, vocab: int, eos: int) -> list[str]:
    """The command-line overrides that run the experiment on the tiny folders."""
    return [f"model.encoder.pretrained={out / 'vit'}", f"model.decoder.pretrained={out / 'gpt2'}",
            f"model.encoder.dim={WIDTH}", f"model.encoder.depth={DEPTH}",
            f"model.encoder.num_heads={HEADS}", "model.encoder.mlp_ratio=2.0",
            "model.encoder.patch_size=8", "model.encoder.image_size=32",
            f"model.decoder.vocab_size={vocab}", f"model.decoder.dim={WIDTH}",
            f"model.decoder.depth={DEPTH}", f"model.decoder.num_heads={HEADS}",
            "model.decoder.max_len=64", f"model.decoder.pad_id={eos}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    out = parser.parse_args().out
    torch.manual_seed(0)
    write_vit(out / "vit")
    vocab = write_gpt2(out / "gpt2")
    eos = json.loads((out / "gpt2" / "config.json").read_text())["eos_token_id"]
    print(" ".join(overrides(out, vocab, eos)))


if __name__ == "__main__":
    main()
