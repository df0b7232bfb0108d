"""PNG files for the tests: reading those the product writes (size from the header, pixels of
a given colour) and writing an image folder of bars for the pipelines that read one."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, read from its header; fails if `data` is not a PNG."""
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    return width, height


def colour_pixels(path: Path, colour: str) -> int:
    """How many pixels of the PNG at `path` have exactly matplotlib colour `colour` (e.g. "C0")."""
    import matplotlib.colors
    import matplotlib.image

    image = matplotlib.image.imread(path)[..., :3]
    target = np.array(matplotlib.colors.to_rgb(colour))
    return int((np.abs(image - target).max(axis=-1) < 2 / 255).sum())


def write_bar_images(
    root: Path, per_split: dict[str, int], classes: tuple[str, str], size: int
) -> None:
    """PNG files `root/<split>/<class>/<n>.png`: a bright bar on noise, across (the first class)
    or down (the second); `per_split[split]` images per split, shared evenly by the classes."""
    from PIL import Image

    generator = np.random.default_rng(7)
    for split, count in per_split.items():
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count // len(classes)):
                pixels = generator.integers(0, 60, size=(size, size), dtype=np.uint8)
                line = generator.integers(2, size - 2)
                if label == 0:
                    pixels[line, 1:-1] = 255
                else:
                    pixels[1:-1, line] = 255
                Image.fromarray(pixels, mode="L").save(folder / f"{index}.png")
