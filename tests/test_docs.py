"""The front door: README.md stays short and links every page of docs/, and every page opens with
a title saying what it holds."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_is_a_short_front_door():
    assert len(README.splitlines()) <= 250


def test_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", README))
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "link these pages from README.md's Documentation table"


def test_every_docs_page_opens_with_a_title():
    for page in (ROOT / "docs").glob("*.md"):
        first = page.read_text().splitlines()[0]
        assert first.startswith("# ") and len(first) > 10, page
