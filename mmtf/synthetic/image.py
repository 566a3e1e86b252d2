"""Built-in shapes -> captions set, written as COCO captions (and ImageFolder for labels).

Each image (64x64 by default) shows 1-3 shapes (circle, square, triangle, cross; six colours, two
sizes) on noisy grey, in a row or a column of cells. 5 captions per image from a paraphrase
grammar; :func:`parse_caption` recovers ``(layout, ((size, colour, shape), ...))`` in reading
order, the sequence event-sequence accuracy scores.

Shapes: images are (h, w, 3) uint8 arrays here, h = w = ``image_size``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmtf.data.formats.coco import write_coco_json
from mmtf.errors import UserError
from mmtf.synthetic.parallel import parallel_map

VERSION = 2
SHAPES = ("circle", "square", "triangle", "cross")
COLORS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 70, 230),
          "yellow": (235, 215, 20), "purple": (150, 40, 190), "orange": (245, 135, 0)}
SIZES = {"small": 0.16, "large": 0.30}  # side of the bounding box, as a share of image_size

ImageSequence = tuple[str, tuple[tuple[str, str, str], ...]]


@dataclass(frozen=True)
class Shape:
    """One drawn object."""

    shape: str
    color: str
    size: str


@dataclass(frozen=True)
class Picture:
    """A whole image: objects in reading order and their arrangement."""

    objects: tuple[Shape, ...]
    layout: str  # single | row | column

    @property
    def sequence(self) -> ImageSequence:
        """What the captions express."""
        return self.layout, tuple((o.size, o.color, o.shape) for o in self.objects)


def sample_picture(rng: np.random.Generator, *, min_objects: int = 1, max_objects: int = 3,
                   first: int | None = None) -> Picture:
    """Draw the content of one image (``first`` fixes the first object's shape index)."""
    n = int(rng.integers(min_objects, max_objects + 1))
    objects = tuple(Shape(SHAPES[int(rng.integers(len(SHAPES)))],
                          list(COLORS)[int(rng.integers(len(COLORS)))],
                          list(SIZES)[int(rng.integers(len(SIZES)))]) for _ in range(n))
    if first is not None:
        objects = (Shape(SHAPES[first], objects[0].color, objects[0].size), *objects[1:])
    layout = "single" if n == 1 else ("row" if rng.random() < 0.5 else "column")
    return Picture(objects, layout)


def render_picture(pic: Picture, size: int, rng: np.random.Generator) -> np.ndarray:
    """The image, (h, w, 3) uint8: each object centred (with jitter) in its own cell."""
    bg = rng.uniform(60, 200) + rng.uniform(-12, 12, size=3)
    img = Image.new("RGB", (size, size), tuple(int(v) for v in bg))
    draw = ImageDraw.Draw(img)
    n = len(pic.objects)
    for i, obj in enumerate(pic.objects):
        side = SIZES[obj.size] * size * rng.uniform(0.9, 1.1)
        cell = size / n
        free_along = max(0.0, (cell - side) / 2 - 1)      # jitter that stays inside the cell
        free_across = max(0.0, (size - side) / 2 - 1)
        along = (i + 0.5) * cell + rng.uniform(-free_along, free_along) * 0.6
        across = size / 2 + rng.uniform(-free_across, free_across) * 0.8
        cx, cy = (along, across) if pic.layout != "column" else (across, along)
        if pic.layout == "single":
            cx, cy = (size / 2 + rng.uniform(-free_across, free_across) * 0.8, across)
        color = tuple(int(np.clip(c + rng.integers(-15, 16), 0, 255)) for c in COLORS[obj.color])
        h = side / 2
        if obj.shape == "circle":
            draw.ellipse([cx - h, cy - h, cx + h, cy + h], fill=color)
        elif obj.shape == "square":
            draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=color)
        elif obj.shape == "triangle":
            draw.polygon([(cx, cy - h), (cx - h, cy + h), (cx + h, cy + h)], fill=color)
        else:
            t = side / 6
            draw.rectangle([cx - h, cy - t, cx + h, cy + t], fill=color)
            draw.rectangle([cx - t, cy - h, cx + t, cy + h], fill=color)
    arr = np.asarray(img).astype(np.float64) + rng.normal(0, 5, size=(size, size, 3))
    return np.clip(np.round(arr), 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------- grammar
SIZE_WORDS = {"small": ["small", "little"], "large": ["large", "big"]}
SHAPE_WORDS = {"circle": ["circle", "disc"], "square": ["square", "box"],
               "triangle": ["triangle"], "cross": ["cross", "plus sign"]}
PREFIXES = ["a picture of ", "an image of ", "there is ", "this image shows ",
            "a photo showing "]
SUFFIXES = [" on a plain background", " in the image"]
TEMPLATES: dict[str, list[str]] = {
    "single": ["{A}"],
    "row2": ["{A} to the left of {B}", "{B} to the right of {A}",
             "{A} on the left and {B} on the right", "{B} on the right and {A} on the left",
             "{A} left of {B}", "from left to right, {A} and {B}",
             "{A} and {B} from left to right"],
    "column2": ["{A} above {B}", "{B} below {A}", "{A} on top and {B} at the bottom",
                "{B} at the bottom and {A} on top", "{B} underneath {A}",
                "from top to bottom, {A} and {B}", "{A} and {B} from top to bottom"],
    "row3": ["from left to right, {A}, {B} and {C}", "{A}, {B} and {C} from left to right",
             "{A} to the left of {B}, which is to the left of {C}",
             "{A} on the left, {B} in the middle and {C} on the right",
             "{C} on the right, {B} in the middle and {A} on the left",
             "{B} in the middle, {A} on the left and {C} on the right"],
    "column3": ["from top to bottom, {A}, {B} and {C}", "{A}, {B} and {C} from top to bottom",
                "{A} above {B}, which is above {C}",
                "{A} at the top, {B} in the middle and {C} at the bottom",
                "{C} at the bottom, {B} in the middle and {A} at the top",
                "{B} in the middle, {A} at the top and {C} at the bottom"],
}


def _key(pic: Picture) -> str:
    n = len(pic.objects)
    return "single" if n == 1 else f"{pic.layout}{n}"


def object_phrase(obj: Shape, rng: np.random.Generator) -> str:
    """One paraphrase of one object, e.g. "a big red disc" or "a blue box that is small"."""
    size = str(rng.choice(SIZE_WORDS[obj.size]))
    shape = str(rng.choice(SHAPE_WORDS[obj.shape]))
    body = f"{size} {obj.color} {shape}" if rng.random() < 0.8 else \
        f"{obj.color} {shape} that is {size}"
    return ("an " if body[0] in "aeiou" else "a ") + body


def make_captions(pic: Picture, rng: np.random.Generator, n: int = 5) -> list[str]:
    """``n`` distinct paraphrased captions of a picture."""
    templates = TEMPLATES[_key(pic)]
    out: list[str] = []
    for attempt in range(20 * n):
        if len(out) == n:
            break
        tpl = templates[int(rng.integers(len(templates)))]
        text = tpl.format(**{k: object_phrase(o, rng) for k, o in zip("ABC", pic.objects)})
        if len(pic.objects) == 1 or rng.random() < 0.2:
            r = rng.random()
            if r < 0.4:
                text = str(rng.choice(PREFIXES)) + text
            elif r < 0.6:
                text += str(rng.choice(SUFFIXES))
        text = text[0].upper() + text[1:] + "."
        if text not in out or attempt >= 10 * n:
            out.append(text)
    return out


# ----------------------------------------------------------------------------- parsing
def _norm(text: str) -> str:
    text = text.lower().replace("-", " ")
    return " ".join(re.findall(r"[a-z]+|,", text))


_WORD_TO = {w: k for k, ws in SIZE_WORDS.items() for w in ws}
_SHAPE_TO = {w: k for k, ws in SHAPE_WORDS.items() for w in ws}
_SIZE_RE = "|".join(_WORD_TO)
_COLOR_RE = "|".join(COLORS)
_SHAPE_RE = "|".join(sorted(_SHAPE_TO, key=len, reverse=True))
_OBJ = (rf"(?:a|an|the|one) (?:(?:{_SIZE_RE}) (?:{_COLOR_RE}) (?:{_SHAPE_RE})"
        rf"|(?:{_COLOR_RE}) (?:{_SHAPE_RE}) that is (?:{_SIZE_RE}))")
_OBJ_PARTS = re.compile(rf"^(?:a|an|the|one) (?:(?P<s1>{_SIZE_RE}) (?P<c1>{_COLOR_RE}) "
                        rf"(?P<h1>{_SHAPE_RE})|(?P<c2>{_COLOR_RE}) (?P<h2>{_SHAPE_RE}) that is "
                        rf"(?P<s2>{_SIZE_RE}))$")
_PRE = "(?:(?:" + "|".join(re.escape(_norm(p)) for p in PREFIXES) + ") )?"
_SUF = "(?: (?:" + "|".join(re.escape(_norm(s)) for s in SUFFIXES) + "))?"


def _compile(tpl: str) -> re.Pattern:
    """A template as a regex over :func:`_norm`'s output (tokens joined by single spaces)."""
    toks = re.findall(r"\{[ABC]\}|[a-zA-Z]+|,", tpl)
    body = " ".join(f"(?P<{t[1]}>{_OBJ})" if t.startswith("{") else re.escape(t.lower())
                    for t in toks)
    return re.compile(rf"^{_PRE}{body}{_SUF}$")


_PATTERNS = [(key, _compile(t)) for key, ts in TEMPLATES.items() for t in ts]


def _object(text: str) -> tuple[str, str, str]:
    m = _OBJ_PARTS.match(text)
    assert m is not None  # the slot regex already matched this phrase
    size = m.group("s1") or m.group("s2")
    color = m.group("c1") or m.group("c2")
    shape = m.group("h1") or m.group("h2")
    return _WORD_TO[size], color, _SHAPE_TO[shape]


def parse_caption(text: str) -> ImageSequence | None:
    """The scene ``(layout, ((size, colour, shape), ...))`` in reading order a caption
    (generated, or a model's output) describes, or None when it cannot be parsed. Case, hyphens
    and punctuation other than commas are ignored."""
    norm = _norm(text)
    results = set()
    for key, pat in _PATTERNS:
        m = pat.match(norm)
        if m is None:
            continue
        layout = "single" if key == "single" else key[:-1]
        slots = [s for s in "ABC" if s in pat.groupindex]
        results.add((layout, tuple(_object(m.group(s)) for s in slots)))
    return results.pop() if len(results) == 1 else None


# ----------------------------------------------------------------------------- writing sets
def _image(task: tuple) -> tuple[str, list[str], int]:
    path, seed_key, size, pic_kw, n_captions = task
    pic = sample_picture(np.random.default_rng([*seed_key, 0]), **pic_kw)
    Image.fromarray(render_picture(pic, size, np.random.default_rng([*seed_key, 1]))).save(path)
    captions = make_captions(pic, np.random.default_rng([*seed_key, 2]), n_captions)
    return Path(path).name, captions, SHAPES.index(pic.objects[0].shape)


def write_caption_set(root: str | Path, *, num_train: int = 3000, num_val: int = 300,
                      num_test: int = 300, seed: int = 0, image_size: int = 64,
                      min_objects: int = 1, max_objects: int = 3, captions_per_image: int = 5,
                      num_workers: int = 2) -> None:
    """Write the shapes captioning set as COCO captions under ``root``.

    Writes ``annotations/captions_{train,val,test}.json`` and ``{train,val,test}/*.png``.

    Args:
        seed: everything is a function of (seed, split, image index).
        image_size: side of the square images in pixels (>= 32).
        min_objects, max_objects: shapes per image (at most 3).
    """
    _check_args(image_size, min_objects, max_objects)
    root = Path(root)
    for split_idx, (split, count) in enumerate((("train", num_train), ("val", num_val),
                                                ("test", num_test))):
        (root / split).mkdir(parents=True, exist_ok=True)
        tasks = [(str(root / split / f"shapes_{split}_{i:05d}.png"), (seed, split_idx, i),
                  image_size, dict(min_objects=min_objects, max_objects=max_objects),
                  captions_per_image) for i in range(count)]
        rows = parallel_map(_image, tasks, num_workers)
        write_coco_json(root, split, [(i + 1, fn, caps, image_size, image_size)
                                      for i, (fn, caps, _) in enumerate(rows)])


def write_label_set(root: str | Path, *, num_train: int = 2000, num_val: int = 200,
                    num_test: int = 200, seed: int = 0, image_size: int = 64,
                    num_workers: int = 2) -> None:
    """Write a one-shape-per-image classification set (label = shape) as ImageFolder.

    Writes ``{train,val,test}/<shape>/*.png`` with the classes of :data:`SHAPES`; image ``i`` of
    a split shows shape ``i % 4`` (balanced classes). Arguments as :func:`write_caption_set`."""
    _check_args(image_size, 1, 1)
    root = Path(root)
    for split_idx, (split, count) in enumerate((("train", num_train), ("val", num_val),
                                                ("test", num_test))):
        for shape in SHAPES:  # every class folder exists, even in tiny sets
            (root / split / shape).mkdir(parents=True, exist_ok=True)
        tasks = [(str(root / split / f"img_{i:05d}.png"), (seed, 10 + split_idx, i), image_size,
                  dict(min_objects=1, max_objects=1, first=i % len(SHAPES)), 0)
                 for i in range(count)]
        for fn, _, label in parallel_map(_image, tasks, num_workers):
            (root / split / fn).rename(root / split / SHAPES[label] / fn)


def _check_args(image_size: int, min_objects: int, max_objects: int) -> None:
    if image_size < 32:
        raise UserError(f"image_size ({image_size}) must be >= 32 so three shapes fit.")
    if not 1 <= min_objects <= max_objects <= 3:
        raise UserError(f"min_objects ({min_objects}) and max_objects ({max_objects}) must "
                         f"satisfy 1 <= min_objects <= max_objects <= 3.")
