"""Bad input to the prefix LLM experiments through ``python -m mmtf.train``: each one line on
stderr and exit 2 (the in-process checks behind them: tests/unit/data/test_instruction.py and
tests/unit/tasks/test_prefix_llm.py)."""

from __future__ import annotations

import json

from tests.unit.data.chat_fixtures import chat, write_clips, write_split

from .conftest import cli_in_process, tiny_overrides

USER_ERRORS = {"HYDRA_FULL_ERROR": "0"}          # the one-line form, exit 2


def one_line_exit_2(out) -> str:
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr[-3000:]
    return lines[0]


def test_an_instruction_line_without_the_media_placeholder(data_dir, tmp_path):
    root = tmp_path / "set"
    write_clips(root, ["a", "b"], [1.0, 1.0])
    good = {"audio": "audio/a.wav", "messages": chat("<|audio|>\nDescribe the sound.", "A tone.")}
    bad = {"audio": "audio/b.wav", "messages": chat("Describe the sound.", "A tone.")}
    for split in ("train", "val", "test"):
        write_split(root, split, [good, bad] if split == "train" else [good])
    args = tiny_overrides("audio_captioning_llm", data_dir, "data=instruction",
                          f"data.root={root}", f"hydra.run.dir={tmp_path / 'run'}")
    args = [a for a in args if not a.startswith("data.synthetic.")]
    line = one_line_exit_2(cli_in_process("mmtf.train", args, tmp_path, USER_ERRORS))
    assert f"{root / 'train.jsonl'} (line 2)" in line
    assert "'messages' holds the media placeholder <|audio|> 0 times" in line


def test_a_prefix_longer_than_the_llm_positions(data_dir, tmp_path):
    # The tiny clips (1-1.5 s) give 13-19 media positions (40 ms frames, 2 per position), the
    # chat about 15 text tokens: over 24 positions, under the generation's own limit check.
    args = tiny_overrides("audio_captioning_llm", data_dir, "model.decoder.max_len=24",
                          "model.generation.max_new_tokens=1",
                          f"hydra.run.dir={tmp_path / 'run'}")
    line = one_line_exit_2(cli_in_process("mmtf.train", args, tmp_path, USER_ERRORS))
    assert "positions once spliced" in line and "more than the LLM's 24" in line
    assert "(max_position_embeddings)" in line


def test_a_pretrained_llm_folder_without_a_chat_template(data_dir, tmp_path):
    from tests.unit.pretrained.tiny_hf import write_llm

    folder = tmp_path / "llm"
    write_llm(folder, hidden=32, layers=1, max_positions=128)
    config = folder / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    del settings["chat_template"]
    config.write_text(json.dumps(settings))
    assert not (folder / "chat_template.jinja").exists()
    args = tiny_overrides("audio_captioning_llm", data_dir, f"hydra.run.dir={tmp_path / 'run'}")
    args = [a for a in args if not a.startswith(("model.decoder.", "tokenizer."))]
    args += ["model/decoder=llm", f"model.decoder.pretrained={folder}", "tokenizer=pretrained",
             f"tokenizer.path={folder}", "model.grow_vocab=true"]
    line = one_line_exit_2(cli_in_process("mmtf.train", args, tmp_path, USER_ERRORS))
    assert str(folder) in line and "chat_template" in line
