"""Markdown helpers shared by the report's sections."""


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A pipe table's lines, followed by a blank line."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]
