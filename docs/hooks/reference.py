"""MkDocs hook: the generated reference tables, and the guides section of the navigation.

- A page's `<!-- reference: NAME -->` line becomes the table `stratoflow.cli.reference_pages`
  makes from the code's own metadata (the training settings, the benchmark's Params, the CLI).
- Every page under docs/guide/ is listed in the navigation under "Guides" (sorted by file name,
  `index.md` first), so adding a guide is adding its file: no line in mkdocs.yml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratoflow.cli.reference_pages import expand

GUIDES = "guide"
GUIDES_TITLE = "Guides"
AFTER = "How-to guides"


def _is_section(item: Any, title: str) -> bool:
    return isinstance(item, dict) and title in item


def on_config(config: Any) -> Any:
    guides = sorted(
        (Path(config["docs_dir"]) / GUIDES).glob("*.md"),
        key=lambda path: (path.name != "index.md", path.name),
    )
    if guides:
        entries = [f"{GUIDES}/{path.name}" for path in guides]
        nav = [item for item in config["nav"] if not _is_section(item, GUIDES_TITLE)]
        # After the how-to guides: a guide is one task of a user's, explained end to end.
        at = next((i + 1 for i, item in enumerate(nav) if _is_section(item, AFTER)), len(nav))
        nav.insert(at, {GUIDES_TITLE: entries})
        config["nav"] = nav
    return config


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return expand(markdown)
