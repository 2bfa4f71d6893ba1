"""Every section of docs/design.md that the code and the docs cite exists, under exactly the cited
heading, and nothing points to a design document outside the repository.

A citation is written ``(docs/design.md, "Section")``; a line break may fall anywhere in it, also
inside the section name and inside a ``#`` comment (the next line's ``#`` is not part of the
name). Markdown files under ``docs/`` may also link a section, ``[design.md, "Section"]
(design.md#section)``: the anchor must be a heading's too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", "runs"}

# `docs/design.md, "Section"` or (inside docs/) `design.md, "Section"`; the name may span lines
CITATION = re.compile(r'(docs/)?design\.md,\s*(?:#\s*)?"([^"]+)"')
ANCHOR = re.compile(r"design\.md#([\w-]+)")
LOCAL = re.compile(r"\]\(#([\w-]+)\)")  # the design's links to its own sections
FOREIGN = re.compile(r"DESIGN\.md")  # the conventions file outside the repository
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def headings(text: str) -> list[str]:
    """The headings of a markdown text, outside fenced code blocks."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            found.append(match.group(2))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def section_name(raw: str) -> str:
    """A cited name as one line: a wrapped comment's ``#`` and every run of spaces become one
    space."""
    return " ".join(re.sub(r"\n\s*#", " ", raw).split())


def problems(path: str, text: str, sections: list[str]) -> list[str]:
    """What is wrong with the design citations of one file (``path`` relative to the root)."""
    inside_docs = path.startswith("docs/")
    anchors = {slug(s) for s in sections}
    bad = []
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        name = section_name(match.group(2))
        if not match.group(1) and not inside_docs:
            bad.append(f"{path}:{line}: cite docs/design.md, not design.md")
        if name not in sections:
            bad.append(f"{path}:{line}: no section {name!r} in docs/design.md")
    if inside_docs:
        for match in ANCHOR.finditer(text):
            if match.group(1) not in anchors:
                line = text.count("\n", 0, match.start()) + 1
                bad.append(f"{path}:{line}: no heading with anchor #{match.group(1)} in "
                           f"docs/design.md")
    for match in FOREIGN.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        bad.append(f"{path}:{line}: DESIGN.md is not in the repository; cite docs/design.md "
                   f'with a section, (docs/design.md, "Section")')
    return bad


def project_files() -> list[Path]:
    """Every ``.py`` and ``.md`` file of the repository but this one."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(folder) / f for f in files if f.endswith((".py", ".md"))]
    return [f for f in sorted(found) if f.resolve() != Path(__file__).resolve()]


def test_every_cited_section_is_a_heading_of_the_design():
    sections = headings(DESIGN.read_text())
    bad = []
    for file in project_files():
        path = file.relative_to(ROOT).as_posix()
        # the design's own links are anchors; its prose may show the citation form itself
        text = file.read_text(encoding="utf-8", errors="replace")
        if file == DESIGN:
            text = CITATION.sub("", text)
            bad += [f"{path}: no heading with anchor #{a}" for a in sorted(set(LOCAL.findall(text)))
                    if a not in {slug(s) for s in sections}]
        bad += problems(path, text, sections)
    assert not bad, "\n".join(bad)


def test_the_design_is_cited_where_the_code_says_so():
    # the scan finds the citations it is meant to check, wrapped ones included
    cited = set()
    for file in project_files():
        if file != DESIGN:
            cited |= {section_name(m.group(2)) for m in CITATION.finditer(file.read_text())}
    assert {"Samplers", "Conventions", "The adapter contract", "Data flow of one iteration",
            "Layers", "Randomness"} <= cited


def test_the_checks_catch_a_missing_section_a_bad_anchor_and_a_foreign_file():
    sections = ["Samplers", "Data flow of one iteration"]
    wrapped = ('"""Text (docs/design.md,\n"Samplers"), more (docs/design.md, "Data flow of one\n'
               'iteration")."""\n'
               '# a comment (docs/design.md, "Data flow\n    # of one iteration")\n')
    assert problems("samplers/x.py", wrapped, sections) == []
    assert problems("samplers/x.py", '(docs/design.md, "Sampler")', sections) == [
        "samplers/x.py:1: no section 'Sampler' in docs/design.md"]
    assert problems("README.md", 'see (design.md, "Samplers")', sections) == [
        "README.md:1: cite docs/design.md, not design.md"]
    assert problems("docs/a.md", "[x](design.md#sampler) [y](design.md#samplers)", sections) == [
        "docs/a.md:1: no heading with anchor #sampler in docs/design.md"]
    assert problems("flowgrpo/x.py", "see DESIGN.md", sections)[0].startswith(
        "flowgrpo/x.py:1: DESIGN.md is not in the repository")


def test_headings_and_anchors_read_like_github():
    text = "# Title\n\n## The adapter contract\n\n```\n# not a heading\n```\n### `sde`: a, b\n"
    assert headings(text) == ["Title", "The adapter contract", "`sde`: a, b"]
    assert slug("The adapter contract") == "the-adapter-contract"
    assert slug("`sde`: Euler-Maruyama with the flow's marginals") == (
        "sde-euler-maruyama-with-the-flows-marginals")
