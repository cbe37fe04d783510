"""Relative links in the README and docs/ lead somewhere: the file, and the heading an anchor names.

GitHub's anchors: a heading lowercased, punctuation but hyphens and spaces dropped, spaces made
hyphens. Links to other sites, and links inside code blocks, are not followed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness.controlplane import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "deploy" / "README.md",
         *sorted((REPO_ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [target for target in LINK.findall(INLINE_CODE.sub("", text))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (
                anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO_ROOT)}: {broken}"
