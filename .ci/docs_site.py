"""MkDocs hook of the documentation site (.ci/mkdocs.yml): its pages, its navigation, and a
strict rule of the API reference.

The pages are the repository's own files, at their own paths: ``README.md`` is the home page,
``notebooks/README.md`` and ``notebooks/*.ipynb`` the tutorials (rendered with their stored
outputs), ``notebooks/guides/*.md`` the guides, ``benchmarks/README.md`` the measurements, and a
generated page the API reference. So their relative links, written for GitHub, resolve on the site
as they stand, and a new guide or notebook joins the navigation by itself (titled by its first
heading; guides in the order of the README's list, then by file name). MkDocs checks the links
of Markdown pages; this hook does the same for the links in the notebooks' Markdown cells, which
mkdocs-jupyter leaves as written.
"""

from __future__ import annotations

import importlib
import logging
import posixpath
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from jinja2 import Environment
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parents[1]
API_PAGE = "api.md"
API_TEXT = """# API reference

Every public name of `nbtrain` (its `__all__`), from its docstring: what `help()` shows.
Accelerate's `accelerate.utils` and `accelerate.tracking` names that nbtrain has follow, then
the handle `nbtrain.start_ranks` returns.

::: nbtrain

::: nbtrain.utils

::: nbtrain.tracking

::: nbtrain.kernel.warm.session.Ranks
"""
# A warning on a logger under "mkdocs" fails a strict build.
log = logging.getLogger("mkdocs.hooks.nbtrain")
# A relative link in rendered HTML: not a URL with a scheme, not an absolute path, not "#anchor".
RELATIVE_HREF = re.compile(r'href="(?![a-zA-Z][a-zA-Z0-9+.-]*:|/|#)([^"#]+)(?:#([^"]*))?"')
# Links from notebooks to headings of other pages, checked once every page is rendered.
anchor_links: list[tuple[str, File, str]] = []


def repo_files(pattern: str) -> list[str]:
    return sorted(path.relative_to(REPO).as_posix() for path in REPO.glob(pattern))


def tutorials() -> list[str]:
    return repo_files("notebooks/*.ipynb")


def guides() -> list[str]:
    """In the order of the README's Guides section, then any it does not list, by file name."""
    readme = (REPO / "README.md").read_text().partition("\n## Guides\n")[2]

    def place(guide: str) -> tuple[int, str]:
        at = readme.find(f"({guide})")
        return (at if at >= 0 else len(readme), guide)

    return sorted(repo_files("notebooks/guides/*.md"), key=place)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.nav = [
        {"Getting started": "README.md"},
        {"Tutorials": ["notebooks/README.md", *tutorials()]},
        {"Guides": guides()},
        {"Measurements": "benchmarks/README.md"},
        {"API reference": API_PAGE},
    ]
    return config


@event_priority(100)  # before mkdocs-jupyter's, which turns the .ipynb files into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    """The pages replace what MkDocs found in docs_dir; the theme's files stay."""
    theme = [file for file in files if file.src_dir != config.docs_dir]
    pages = ["README.md", "benchmarks/README.md", "notebooks/README.md", *tutorials(), *guides()]
    urls = config.use_directory_urls
    site = Files([*theme, *(File(page, str(REPO), config.site_dir, urls) for page in pages)])
    site.append(File.generated(config, API_PAGE, content=API_TEXT))
    return site


def on_pre_build(config: MkDocsConfig) -> None:
    """A public name without a docstring would be a bare signature in the reference: refuse it.
    (nbtrain loads its names on first use, so each is looked up as a user would.)"""
    sys.path.insert(0, str(REPO))  # this checkout's nbtrain, as the reference reads it
    try:
        nbtrain = importlib.import_module("nbtrain")
    finally:
        sys.path.remove(str(REPO))
    for name in nbtrain.__all__:
        if name != "__version__" and not (getattr(nbtrain, name).__doc__ or "").strip():
            log.warning(f"nbtrain.{name} has no docstring: write one (the API reference shows it)")


def on_page_content(html: str, page: Page, files: Files, **_: Any) -> str:
    """A notebook's link to a file of the repository leads to the page built from it (the same
    rewriting MkDocs applies to Markdown pages); a link to anything else is a warning."""
    if not page.file.src_uri.endswith(".ipynb"):
        return html

    def rewrite(link: re.Match[str]) -> str:
        path, anchor = unquote(link[1]), link[2]
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page.file.src_uri), path))
        file = files.get_file_from_path(target)
        if file is None or not file.is_documentation_page():
            log.warning(f"Notebook '{page.file.src_uri}' links to '{link[1]}': not a page")
            return link[0]
        if anchor:
            anchor_links.append((page.file.src_uri, file, anchor))
        return f'href="{file.url_relative_to(page.file)}{"#" + anchor if anchor else ""}"'

    return RELATIVE_HREF.sub(rewrite, html)


def on_env(env: Environment, files: Files, **_: Any) -> Environment:
    """Every page is rendered now: check the headings that notebooks link to."""
    for source, file, anchor in anchor_links:
        present = getattr(file.page, "present_anchor_ids", None)  # None: a notebook's page
        if present is not None and anchor not in present:
            log.warning(f"Notebook '{source}' links to '{file.src_uri}#{anchor}': no such heading")
    anchor_links.clear()
    return env
