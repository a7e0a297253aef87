"""The README as a landing page and the docs/ site: the site builds with ``mkdocs build --strict``,
which turns a page missing from the nav, a broken link or a broken anchor into an error (the
``validation`` settings of mkdocs.yml); the README stays short and links only to files that exist.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import mkdocs  # noqa: F401  (in the test extra: a missing mkdocs must fail here, not skip)
import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
README = os.path.join(REPO, "README.md")
README_MAX_LINES = 220

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _build(config_dir: str, site_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site_dir],
        cwd=config_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _links(markdown: str) -> list[str]:
    """Targets of the markdown links outside code blocks and code spans."""
    text = _INLINE_CODE.sub("", _FENCE.sub("", markdown))
    return _LINK.findall(text)


def _nav_pages(nav) -> list[str]:
    out = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            out += _nav_pages(value)
        else:
            out.append(value)
    return out


def _docs_pages() -> set[str]:
    pages = set()
    for root, _, files in os.walk(DOCS):
        for f in files:
            if f.endswith(".md"):
                pages.add(os.path.relpath(os.path.join(root, f), DOCS).replace(os.sep, "/"))
    return pages


def test_docs_build_strictly(tmp_path):
    r = _build(REPO, str(tmp_path / "site"))
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "data" / "index.html").is_file()


@pytest.mark.parametrize(
    "breakage, page, text, message",
    [
        ("page left out of the nav", "orphan.md", "# Orphan\n", "not included in the \"nav\""),
        ("link to a missing page", "index.md", "\n[gone](no-such-page.md)\n", "no-such-page.md"),
        ("link to a missing anchor", "index.md", "\n[gone](data.md#no-such-section)\n", "no-such-section"),
    ],
)
def test_strict_build_fails_on(tmp_path, breakage, page, text, message):
    """The validation settings are what make these errors: a copy of the site with one breakage
    must not build."""
    shutil.copy(os.path.join(REPO, "mkdocs.yml"), tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    with open(tmp_path / "docs" / page, "a", encoding="utf-8") as f:
        f.write(text)
    r = _build(str(tmp_path), str(tmp_path / "site"))
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"{breakage}: the strict build passed:\n{out}"
    assert message in out, out


def test_every_docs_page_is_in_the_nav():
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    assert config.get("docs_dir", "docs") == "docs"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), f"pages listed twice in the nav: {sorted(p for p in nav if nav.count(p) > 1)}"
    pages = _docs_pages()
    assert pages - set(nav) == set(), "docs pages missing from mkdocs.yml's nav"
    assert set(nav) - pages == set(), "nav entries without a page under docs/"


def test_readme_is_a_short_landing_page():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    n = len(text.splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move sections into docs/ (at most {README_MAX_LINES})"
    assert "make test" in text and "make demo" in text
    # the headline table sits right under its heading, as a markdown table
    after = text.split("\n## The demo\n", 1)[1].lstrip("\n")
    assert after.startswith("| selector |"), after[:80]


def test_readme_links_point_to_files_that_exist():
    with open(README, encoding="utf-8") as f:
        links = _links(f.read())
    local = [t for t in links if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    assert "docs/index.md" in local
    missing = [t for t in local if not os.path.exists(os.path.join(REPO, t.split("#", 1)[0]))]
    assert missing == [], f"README.md links to missing files: {missing}"
    linked_pages = {t.split("#", 1)[0][len("docs/"):] for t in local if t.startswith("docs/")}
    assert _docs_pages() - linked_pages == set(), "docs pages the README does not link to"


def test_examples_do_not_use_this_checkout_data_folder():
    """Example commands must work outside this repository: ../shared/data exists only beside it."""
    files = [README] + [os.path.join(DOCS, p) for p in sorted(_docs_pages())]
    offenders = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            blocks = _FENCE.findall(f.read())
        offenders += [os.path.relpath(path, REPO) for b in blocks if "shared/data" in b]
    assert offenders == [], f"code examples that read ../shared/data: {offenders}"


def test_links_parser_sees_links_and_skips_code():
    md = "see [a](docs/a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](https://x.org/d \"t\")\n"
    assert _links(md) == ["docs/a.md", "https://x.org/d"]
