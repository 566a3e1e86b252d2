"""The shapes set: grammar round trip, parser, rendering, COCO / ImageFolder layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mmtf.data.formats import read_coco, read_image_folder
from mmtf.synthetic import image as si


def test_thousands_of_captions_parse_back_to_their_scene():
    n = 0
    for i in range(1000):
        pic = si.sample_picture(np.random.default_rng([3, i]))
        for caption in si.make_captions(pic, np.random.default_rng([4, i])):
            assert si.parse_caption(caption) == pic.sequence, caption
            n += 1
    assert n == 5000


@pytest.mark.parametrize("key", sorted(si.TEMPLATES))
def test_every_template_parses(key):
    rng = np.random.default_rng(0)
    n = 1 if key == "single" else int(key[-1])
    layout = "single" if key == "single" else key[:-1]
    for tpl in si.TEMPLATES[key]:
        for _ in range(20):
            objs = si.sample_picture(rng, min_objects=n, max_objects=n).objects
            text = tpl.format(**{k: si.object_phrase(o, rng) for k, o in zip("ABC", objs)})
            expected = (layout, tuple((o.size, o.color, o.shape) for o in objs))
            assert si.parse_caption(text) == expected, text


def test_relations_and_reading_order():
    red = ("small", "red", "circle")
    blue = ("large", "blue", "square")
    assert si.parse_caption("A small red circle to the left of a big blue box.") == \
        ("row", (red, blue))
    assert si.parse_caption("a big blue square to the right of a small red disc") == \
        ("row", (red, blue))
    assert si.parse_caption("A large blue square below a small red circle") == \
        ("column", (red, blue))
    assert si.parse_caption("There is a red circle that is small.") == ("single", (red,))


@pytest.mark.parametrize("text", ["", "a red circle", "a small red circle near a big blue box",
                                  "a small red circle to the left of",
                                  "a huge red circle", "a small pink circle"])
def test_unparsable_captions_give_none(text):
    assert si.parse_caption(text) is None


def test_rendered_objects_are_where_the_layout_says():
    """Each object's colour is found in its own cell: left to right, or top to bottom."""
    for i in range(40):
        pic = si.sample_picture(np.random.default_rng(i), min_objects=2, max_objects=3)
        img = si.render_picture(pic, 64, np.random.default_rng(i)).astype(int)
        n = len(pic.objects)
        for k, obj in enumerate(pic.objects):
            cell = slice(k * 64 // n, (k + 1) * 64 // n)
            region = img[:, cell] if pic.layout == "row" else img[cell, :]
            dist = np.abs(region - np.array(si.COLORS[obj.color])).sum(-1)
            assert (dist < 60).sum() >= 8, (i, k, obj)


def test_sizes_differ_in_area():
    areas = {}
    for size in ("small", "large"):
        pic = si.Picture((si.Shape("square", "red", size),), "single")
        img = si.render_picture(pic, 64, np.random.default_rng(0)).astype(int)
        areas[size] = (np.abs(img - np.array(si.COLORS["red"])).sum(-1) < 60).sum()
    assert areas["large"] > 2.5 * areas["small"]


def test_written_caption_set_is_coco(tmp_path):
    si.write_caption_set(tmp_path, num_train=4, num_val=2, num_test=2, image_size=48)
    data = json.loads((tmp_path / "annotations" / "captions_train.json").read_text())
    assert {"images", "annotations"} <= set(data) and len(data["images"]) == 4
    assert len(data["annotations"]) == 20
    items = read_coco(tmp_path, "train", report=pytest.fail)
    assert len(items) == 4
    for item in items:
        assert Image.open(item.path).size == (48, 48)
        assert len({si.parse_caption(c) for c in item.captions}) == 1


def test_written_label_set_is_image_folder(tmp_path):
    si.write_label_set(tmp_path, num_train=8, num_val=4, num_test=4, image_size=32)
    labels = read_image_folder(tmp_path, "train", report=pytest.fail)
    assert labels.class_names == sorted(si.SHAPES) and len(labels.items) == 8
    for item in labels.items:
        assert item.path.parent.name == labels.class_names[item.label]
    counts = [sum(i.label == k for i in labels.items) for k in range(4)]
    assert counts == [2, 2, 2, 2]  # balanced


def test_image_size_is_checked(tmp_path):
    with pytest.raises(ValueError, match=r"image_size \(16\) must be >= 32"):
        si.write_caption_set(tmp_path, image_size=16)
