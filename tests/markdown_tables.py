"""Reading back the tables of a written SUMMARY.md: the tests check what a reader sees."""

from __future__ import annotations


def section(text: str, heading: str) -> str:
    """The Markdown under ``heading`` (a whole line), up to the next heading."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return "\n".join(lines[start:end])


def table_under(text: str, heading: str) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows) of the table under ``heading``: the paragraph before it, its
    header cells and its rows' cells."""
    lines = [line for line in section(text, heading).splitlines() if line.strip()]
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[first:]
             if line.startswith("|")]
    return " ".join(lines[:first]), cells[0], cells[2:]
