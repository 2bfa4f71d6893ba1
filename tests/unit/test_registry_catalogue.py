"""The README's registry table and ``flowgrpo list`` name the same pieces, kind by kind, and the
kinds are declared once: every declared kind is listed, checked by the config and documented."""

from __future__ import annotations

import re
from pathlib import Path

from flowgrpo.cli.main import main
from flowgrpo.config.pieces import SLOTS
from flowgrpo.registry import KINDS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def readme_table() -> dict[str, set[str]]:
    """``{title: names}`` of the table under "Pieces and their registries": the title is the
    first column before its parenthesis, the names the backticked words of the second column
    outside parentheses (the notes)."""
    section = README.split("## Pieces and their registries", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # no header
    table = {}
    for row in rows:
        kind, names = (cell.strip() for cell in row.strip("|").split("|")[:2])
        while "(" in names:  # innermost first, so a note may hold a parenthesis
            names = re.sub(r"\([^()]*\)", "", names)
        table[kind.split(" (")[0]] = set(re.findall(r"`([^`]+)`", names))
    return table


def listed(capsys) -> dict[str, set[str]]:
    """``{title: names}`` of the ``built-in:`` part of ``flowgrpo list``."""
    assert main(["list"]) == 0
    out = capsys.readouterr().out.split("plug-ins:")[0]
    rows = [line.strip().split(": ", 1) for line in out.splitlines()[1:]]
    return {title: set(names.split(", ")) for title, names in rows}


def test_the_readme_table_names_what_flowgrpo_list_prints(capsys):
    table, printed = readme_table(), listed(capsys)
    assert list(table) == list(printed) == [kind.title for kind in KINDS]
    for title in printed:
        assert table[title] == printed[title], title


def test_every_kind_with_plug_ins_is_named_by_a_config_key_and_has_its_group_in_the_readme():
    checked = {slot.kind for slot in SLOTS}
    for kind in KINDS:
        if kind.group:
            assert kind.name in checked, kind.name
            assert f"`{kind.group}`" in README, kind.group


def test_every_declared_home_holds_the_registry_of_its_kind():
    from flowgrpo.config.pieces import registry_of, resolve
    from flowgrpo.registry import Registry, entry_point_group

    for kind in KINDS:
        if not kind.group:  # a fixed list of names
            assert isinstance(resolve(kind.name), tuple) and resolve(kind.name)
            continue
        registry = registry_of(kind.name)
        assert isinstance(registry, Registry) and registry.kind == kind.name
        assert registry.title == kind.title and registry.group == kind.group
        assert entry_point_group(kind.name) == kind.group
