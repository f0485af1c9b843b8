"""The manual as the tests that check what it says read it: README.md and the docs/ pages it links
to (a statement may live on any of them)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def manual_pages() -> list[Path]:
    """README.md first, then every docs/ page."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def manual_text() -> str:
    """The manual's text: every page, one after another."""
    return "\n".join(page.read_text() for page in manual_pages())
