"""Reading the PNGs the tests check: size from the header, pixels of a given colour."""

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
