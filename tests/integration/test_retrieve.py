"""`python -m mmtf.retrieve` (in-process) and the CLAP score of `mmtf.evaluate`, on tiny
random-weight contrastive checkpoints: rankings and scores equal the checkpoint's towers called
by hand on each clip and text, an index written once ranks as embedding afresh does, and bad
input is one line with exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import mmtf
from mmtf.data.audio import load_audio
from mmtf.errors import UserError
from mmtf.retrieve.index import EmbeddingIndex
from tests.unit.predict.contrastive_ckpt import RATE, save_contrastive_ckpt

from .conftest import cli_in_process, evaluate_in_process, run_cli

USER_ERRORS = {"HYDRA_FULL_ERROR": "0"}          # the one-line form, exit 2
TEXTS = ["a dog barks", "rain falls on a roof", "a siren wails", "birds sing"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ckpts")
    return {"a": save_contrastive_ckpt(folder / "a.ckpt", seed=0),
            "b": save_contrastive_ckpt(folder / "b.ckpt", seed=1),          # same width
            "narrow": save_contrastive_ckpt(folder / "n.ckpt", embed_dim=8),
            "image": save_contrastive_ckpt(folder / "i.ckpt", modality="image")}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    """Four clips of 0.5-1.25 s (one in a subfolder) and a file that is no audio."""
    folder = tmp_path_factory.mktemp("clips")
    rng = np.random.default_rng(0)
    (folder / "more").mkdir()
    for i, name in enumerate(["b.wav", "a.wav", "more/c.wav", "d.wav"]):
        t = np.arange(int((0.5 + 0.25 * i) * RATE)) / RATE
        wave = 0.3 * np.sin(2 * np.pi * (300 + 500 * i) * t) + 0.01 * rng.normal(size=t.size)
        sf.write(folder / name, wave.astype(np.float32), RATE, subtype="FLOAT")
    (folder / "notes.txt").write_text("not audio\n")
    return folder


def _files(clips: Path) -> list[Path]:
    return sorted(p for p in clips.rglob("*.wav"))       # the folder as the CLI expands it


@torch.no_grad()
def _by_hand(ckpt: Path, files: list[Path], texts: list[str]) -> torch.Tensor:
    """(texts, files) cosines from the towers, one unpadded clip or text at a time."""
    task = mmtf.load(ckpt)[0].task
    media = []
    for path in files:
        wave = torch.from_numpy(sf.read(path, dtype="float32")[0])
        media.append(task.embed_media(wave[None], torch.tensor([wave.shape[0]]))[0])
    text = []
    for caption in texts:
        ids = torch.tensor(task.tokenizer.encode_batch([caption]))          # <bos> .. <eos>
        text.append(task.embed_text(ids, torch.ones_like(ids, dtype=torch.bool))[0])
    return torch.stack(text) @ torch.stack(media).T


def _ranking(scores: torch.Tensor, names: list[str], k: int) -> list[list[tuple[str, float]]]:
    """Best first, ties in item order (sorted() is stable)."""
    return [[(names[i], float(row[i])) for i in sorted(range(len(names)),
                                                          key=lambda i: -float(row[i]))[:k]]
            for row in scores]


def _retrieve(tmp_path: Path, *args: str):
    return cli_in_process("mmtf.retrieve", [*args, "accelerator=cpu",
                                            f"hydra.run.dir={tmp_path / 'hydra'}"],
                          cwd=tmp_path, env=USER_ERRORS)


def _hits(stdout: str) -> list[list[tuple[str, float]]]:
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [[(hit["item"], hit["score"]) for hit in row["results"]] for row in rows]


def _assert_same(got, expected):
    assert [[name for name, _ in row] for row in got] == [[n for n, _ in row] for row in expected]
    for g, e in zip(got, expected):
        np.testing.assert_allclose([s for _, s in g], [s for _, s in e], atol=1e-5)


def test_text_queries_rank_a_folder_as_the_towers_do(ckpts, clips, tmp_path):
    files = _files(clips)
    (tmp_path / "queries.txt").write_text(f"{TEXTS[0]}\n\n{TEXTS[2]}\n")
    out = _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"media={clips}",
                    f"queries={tmp_path / 'queries.txt'}", "top_k=3", "format=json")
    assert out.returncode == 0, out.stderr[-3000:]
    expected = _ranking(_by_hand(ckpts["a"], files, [TEXTS[0], TEXTS[2]]),
                        [str(f) for f in files], 3)
    _assert_same(_hits(out.stdout), expected)
    table = _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"media={clips}",
                      f"query={TEXTS[0]}", "top_k=2")
    assert table.returncode == 0, table.stderr[-3000:]
    lines = [line for line in table.stdout.splitlines() if line.strip()]
    assert lines[0] == f"query: {TEXTS[0]}"
    assert lines[1].split() == ["1", f"{expected[0][0][1]:+.4f}", expected[0][0][0]]
    assert lines[2].split()[::2] == ["2", expected[0][1][0]]


def test_an_index_written_once_ranks_as_embedding_afresh(ckpts, clips, tmp_path):
    index = tmp_path / "clips.safetensors"
    out = _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"media={clips}", f"index_out={index}")
    assert out.returncode == 0 and f"Wrote {index} (4 audio items, 16-wide)" in out.stderr
    assert not out.stdout.strip()                 # no query: only the index is written
    stored = EmbeddingIndex.load(index)
    files = _files(clips)
    assert stored.items == [str(f) for f in files] and stored.modality == "audio"
    fresh = _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"media={clips}",
                      f"query={TEXTS[1]}", "format=json")
    reused = _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"index={index}",
                       f"query={TEXTS[1]}", "format=json")
    assert reused.returncode == 0, reused.stderr[-3000:]
    expected = _ranking(_by_hand(ckpts["a"], files, [TEXTS[1]]), stored.items, 10)
    _assert_same(_hits(reused.stdout), expected)
    _assert_same(_hits(fresh.stdout), expected)


def test_a_media_query_ranks_captions(ckpts, clips, tmp_path):
    (tmp_path / "captions.txt").write_text("\n".join(TEXTS) + "\n")
    query = clips / "d.wav"
    out = _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"texts={tmp_path / 'captions.txt'}",
                    f"media_query={query}", "format=json", "top_k=4",
                    f"index_out={tmp_path / 'texts.st'}")
    assert out.returncode == 0, out.stderr[-3000:]
    expected = _ranking(_by_hand(ckpts["a"], [query], TEXTS).T, TEXTS, 4)
    _assert_same(_hits(out.stdout), expected)
    assert EmbeddingIndex.load(tmp_path / "texts.st").items == TEXTS


def test_bad_input_is_one_line_and_exit_2(ckpts, clips, tmp_path, audio_captioner):
    index = tmp_path / "a.safetensors"
    assert _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"media={clips}",
                     f"index_out={index}").returncode == 0
    (tmp_path / "captions.txt").write_text("\n".join(TEXTS) + "\n")
    text_index = tmp_path / "t.safetensors"
    assert _retrieve(tmp_path, f"ckpt_path={ckpts['a']}", f"texts={tmp_path / 'captions.txt'}",
                     f"index_out={text_index}").returncode == 0
    EmbeddingIndex(torch.zeros(0, 16), [], "audio", "x").save(tmp_path / "empty.safetensors")
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.png").write_bytes(b"")
    query = f"query={TEXTS[0]}"
    cases = {
        "empty folder": ([f"ckpt_path={ckpts['a']}", f"media={tmp_path / 'empty'}", query],
                         r"media: no \S+ files found in \['\S+empty'\]"),
        "empty index": ([f"ckpt_path={ckpts['a']}", f"index={tmp_path / 'empty.safetensors'}",
                         query], r"no audio items in it \(an empty index\)"),
        "another checkpoint": ([f"ckpt_path={ckpts['b']}", f"index={index}", query],
                               rf"embedded by another checkpoint \({ckpts['a']}, weights \w+\) "
                               rf"than ckpt_path={ckpts['b']}"),
        "another width": ([f"ckpt_path={ckpts['narrow']}", f"index={index}", query],
                          rf"holds 16-wide embeddings \(from {ckpts['a']}\) but "
                          rf"ckpt_path={ckpts['narrow']} embeds 8-wide ones"),
        "text query, text index": ([f"ckpt_path={ckpts['a']}", f"index={text_index}", query],
                                   r"holds text embeddings, and the query ranks audio; pass "
                                   r"media_query=<file>"),
        "media as query": ([f"ckpt_path={ckpts['a']}", f"media={clips}",
                            f"query={clips / 'a.wav'}"], r"is a media file, and a query is "
                                                         r"text; pass media_query="),
        "image for audio": ([f"ckpt_path={ckpts['a']}", f"texts={tmp_path / 'captions.txt'}",
                             f"media_query={tmp_path / 'x.png'}"],
                            r"media_query=\S+x.png is an image file, and this checkpoint "
                            r"embeds audio"),
        "not contrastive": ([f"ckpt_path={audio_captioner.ckpt}", f"media={clips}", query],
                            r"a CaptioningTask has no shared media-text embedding; load a "
                            r"contrastive checkpoint"),
        "both directions": ([f"ckpt_path={ckpts['a']}", f"media={clips}", query,
                             f"media_query={clips / 'a.wav'}"], r"both set"),
    }
    for case, (args, message) in cases.items():
        out = _retrieve(tmp_path, *args)
        assert out.returncode == 2, (case, out.stderr[-3000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mmtf: error: "), (case, out.stderr)
        assert re.search(message, lines[0]), (case, lines[0])


def test_clap_score_is_the_mean_cosine_of_caption_and_audio(audio_captioner, ckpts, tmp_path):
    metrics = evaluate_in_process(audio_captioner.ckpt, tmp_path / "e",
                                  f"clap_ckpt={ckpts['a']}")
    rows = [json.loads(line) for line in
            (tmp_path / "e" / "predictions.jsonl").read_text().splitlines()]
    assert rows and "test/cider_d" in metrics
    # by hand: each id's file in the synthetic set, read at the CLAP checkpoint's 16 kHz
    task = mmtf.load(ckpts["a"])[0].task
    files = {p.stem: p for p in audio_captioner.data_dir.rglob("*.wav")}
    expected = []
    with torch.no_grad():
        for row in rows:
            wave = load_audio(files[row["id"]], sample_rate=RATE)        # 1-1.5 s, under 2 s
            audio = task.embed_media(wave[None], torch.tensor([wave.shape[0]]))[0]
            ids = torch.tensor(task.tokenizer.encode_batch([row["prediction"]]))
            text = task.embed_text(ids, torch.ones_like(ids, dtype=torch.bool))[0]
            expected.append(float(audio @ text))
    np.testing.assert_allclose([row["clap_score"] for row in rows], expected, atol=1e-5)
    assert metrics["test/clap_score"] == pytest.approx(float(np.mean(expected)), abs=1e-6)
    assert "test/clap_score" in json.loads((tmp_path / "e" / "metrics.json").read_text())


def test_clap_score_refuses_the_wrong_checkpoint_before_scoring(audio_captioner, ckpts,
                                                                tmp_path):
    with pytest.raises(UserError, match=r"clap_ckpt=\S+i.ckpt embeds image but the captioner "
                                        r"reads audio; name an audio-text \(CLAP\)"):
        evaluate_in_process(audio_captioner.ckpt, tmp_path / "i", f"clap_ckpt={ckpts['image']}")
    with pytest.raises(UserError, match=r"clap_ckpt=\S+: a CaptioningTask has no shared "
                                        r"media-text embedding"):
        evaluate_in_process(audio_captioner.ckpt, tmp_path / "c",
                            f"clap_ckpt={audio_captioner.ckpt}")


def test_the_console_command_ranks_and_exits_2_on_bad_input(ckpts, clips, tmp_path):
    """``python -m mmtf.retrieve`` as a user runs it (the other tests call main() in-process)."""
    ok = run_cli("mmtf.retrieve", [f"ckpt_path={ckpts['a']}", f"media={clips}",
                                   f"query={TEXTS[3]}", "top_k=1", "accelerator=cpu",
                                   f"hydra.run.dir={tmp_path / 'ok'}"], cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stdout.splitlines()[0] == f"query: {TEXTS[3]}"
    bad = run_cli("mmtf.retrieve", [f"ckpt_path={ckpts['a']}", f"media={clips}",
                                    "accelerator=cpu", f"hydra.run.dir={tmp_path / 'bad'}"],
                  cwd=tmp_path, env=USER_ERRORS)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert "nothing to rank: set query=" in bad.stderr
