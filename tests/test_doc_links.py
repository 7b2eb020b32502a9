"""Every relative link in the README and docs/ reaches a file of this repository: a fresh
clone holds everything its documentation points to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "client" / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title"), ![alt](target)
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)  # [label]: target
ABSOLUTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.IGNORECASE)  # a scheme, a host or an anchor


def relative_links(markdown: str) -> list[str]:
    """The link targets of ``markdown`` that name a path, outside code blocks and spans."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = INLINE.findall(prose) + DEFINITION.findall(prose)
    return [target for target in targets if not ABSOLUTE.match(target)]


def test_the_parser_finds_links_and_skips_code_and_urls():
    page = (
        'See [spec](reference/api_spec.md#errors) and ![shot](console.png "the console").\n'
        "[`code` in text](../up.md) `[not](a-link.md)` <https://example.com> [web](https://example.com)\n"
        "```\n[not](in-a-fence.md)\n```\n[ref]: ./defined.md\n[top](#anchor)\n"
    )
    assert relative_links(page) == ["reference/api_spec.md#errors", "console.png", "../up.md", "./defined.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page):
    broken = []
    for target in relative_links(page.read_text()):
        path = (page.parent / target.split("#")[0].split("?")[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links outside the repository or to nothing: {broken}"
