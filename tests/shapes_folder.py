"""A small photograph-like image folder: one sub-folder per shape (circle, square, triangle,
cross), each image a shape of random colour, size and position (inside the centre square that
``convert`` keeps) on a random background in contrast, at a random size, saved as JPEG or PNG.
``make images`` converts and trains on it; the tests do too.

    python tests/shapes_folder.py DIR [--per-class N] [--seed S]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SHAPES = ("circle", "cross", "square", "triangle")


def draw(shape: str, rng: np.random.Generator):
    """One image of ``shape`` (a Pillow image)."""
    from PIL import Image, ImageDraw

    width, height = (int(v) for v in rng.integers(40, 97, size=2))
    background = tuple(int(v) for v in rng.integers(0, 256, size=3))
    lighter = background[0] + background[1] + background[2] < 3 * 128
    colour = tuple(int(v) for v in (rng.integers(160, 256, size=3) if lighter
                                    else rng.integers(0, 96, size=3)))  # in contrast
    image = Image.new("RGB", (width, height), background)
    pen = ImageDraw.Draw(image)
    square = min(width, height)  # the centre square, which convert keeps
    side = int(rng.integers(square // 3, square * 3 // 4 + 1))
    x0 = (width - square) // 2 + int(rng.integers(0, square - side + 1))
    y0 = (height - square) // 2 + int(rng.integers(0, square - side + 1))
    x1, y1 = x0 + side, y0 + side
    if shape == "circle":
        pen.ellipse((x0, y0, x1, y1), fill=colour)
    elif shape == "square":
        pen.rectangle((x0, y0, x1, y1), fill=colour)
    elif shape == "triangle":
        pen.polygon(((x0, y1), ((x0 + x1) // 2, y0), (x1, y1)), fill=colour)
    else:
        bar = max(side // 4, 2)
        middle_x, middle_y = (x0 + x1) // 2, (y0 + y1) // 2
        pen.rectangle((middle_x - bar // 2, y0, middle_x + bar // 2, y1), fill=colour)
        pen.rectangle((x0, middle_y - bar // 2, x1, middle_y + bar // 2), fill=colour)
    return image


def make_folder(root: Path, per_class: int, seed: int = 0,
                shapes: tuple[str, ...] = SHAPES) -> Path:
    """``root/SHAPE/NNNN.jpg|png``, ``per_class`` images of each of ``shapes``; ``root``."""
    rng = np.random.default_rng(seed)
    for shape in shapes:
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            suffix = ".jpg" if k % 2 == 0 else ".png"
            draw(shape, rng).save(folder / f"{k:04d}{suffix}")
    return root


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_folder(args.root, args.per_class, args.seed)
    print(f"wrote {args.per_class * len(SHAPES)} images of {len(SHAPES)} shapes under {args.root}")
