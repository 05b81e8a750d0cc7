"""Tables that fit the terminal they are printed in: numbers and ids stay whole, free text folds, and when even
that is too wide the columns a reader needs least are left out (in the order the table names them). A long table
prints its rows as lines of padded cells, rich folding only the cells that need it: rich's layout of every cell
took half a millisecond a row (20,000 jobs: 16 s), and the lines are the same."""

from __future__ import annotations

import copy

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.table import Column, Table
from rich.text import Text

MANY_ROWS = 200  # from here a table's rows are printed as padded lines (padded_rows)


class Fitted:
    """A table measured against the console's width when it is printed, so one table serves 80, 100 or 200
    columns: rich alone would shrink every column and cut ids and numbers to "…"."""

    def __init__(self, table: Table, optional: tuple[str, ...]):
        self.table, self.optional = table, optional

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = copy.copy(self.table)
        table.columns = [copy.copy(c) for c in table.columns]  # widths set below are this printing's
        for header in self.optional:
            if least_width(table) <= options.max_width:
                break
            table.columns = [c for c in table.columns if c.header != header]
        share_out(table, options.max_width - least_width(table))
        if len(table.rows) >= MANY_ROWS and least_width(table) <= options.max_width:  # else rich shrinks columns
            yield from padded_rows(table, console)
        else:
            yield table


def share_out(table: Table, spare: int) -> None:
    """When the folding columns cannot all print whole, fix each one's width at its minimum plus a share of the
    `spare` columns in proportion to what it wants more: rich's own shrinking ignores minimum widths, and a
    column it shrinks below one is then printed wider than planned and the line's end is cut."""
    folding = [c for c in table.columns if not c.no_wrap]
    wants = [natural_width(c) - (c.min_width or 0) for c in folding]
    if sum(wants) <= spare or sum(wants) == 0:  # all whole, or nothing folds: rich shrinks what it must
        return
    for column, want in zip(folding, wants):
        column.width = (column.min_width or 0) + max(0, spare) * want // sum(wants)


def padded_rows(table: Table, console: Console) -> RenderResult:
    """The table as rich prints it, its rows without rich's layout of each cell: rich prints the title, header and
    rule (a copy without rows, each column at its width: the one share_out set, or its widest cell), then each row
    is printed as lines of its cells padded to those widths, one space apart; a cell wider than its column folds as
    rich folds it (Text.wrap); the box's blank line follows a row that ends a section. A table with styled rows or
    columns, a caption, a footer or cells other than text is left to rich."""
    plain = not (table.caption or table.show_footer or table.show_lines or table.row_styles or table.leading)
    plain &= all(c.justify in ("left", "right") and not c.style for c in table.columns)
    plain &= all(isinstance(cell, str | Text) for column in table.columns for cell in column.cells)
    if not plain or any(row.style is not None for row in table.rows):
        yield table
        return
    widths = [c.width or natural_width(c) for c in table.columns]
    head = copy.copy(table)
    head.rows, head.columns = [], [copy.copy(c) for c in table.columns]
    for column, width in zip(head.columns, widths):
        column._cells, column.width = [], width
    yield head
    section = Segment(table.box.get_row(widths, "row", edge=False), console.get_style(table.border_style or ""))
    for row, cells in zip(table.rows, zip(*(c.cells for c in table.columns))):
        parts = [cell_lines(cell, width, column, console) for cell, width, column in zip(cells, widths, table.columns)]
        for at in range(max(len(lines) for lines in parts)):
            line = [lines[at] if at < len(lines) else " " * width for lines, width in zip(parts, widths)]
            if all(isinstance(part, str) for part in line):
                yield Segment(" ".join(line))
            else:
                yield from Text(" ").join(Text(p) if isinstance(p, str) else p for p in line).render(console)
            yield Segment.line()
        if row.end_section:
            yield from (section, Segment.line())


def cell_lines(cell, width: int, column: Column, console: Console) -> list:
    """The cell's lines, each `width` wide: a plain string that fits is padded as it is (most cells: no Text made);
    anything else is wrapped by rich (Text.wrap pads to the width, folds a word too long)."""
    if plain_string(cell) and cell_len(cell) <= width:
        pad = " " * (width - cell_len(cell))
        return [cell + pad if column.justify == "left" else pad + cell]
    return list(cell_text(cell).wrap(console, width, justify=column.justify, overflow=column.overflow))


def plain_string(cell) -> bool:
    """A string rich prints as it is: no markup tag, no emoji code (:name:), no control character."""
    return isinstance(cell, str) and "[" not in cell and cell.count(":") < 2 and cell.isprintable()


def cell_text(cell) -> Text:
    """A cell as rich reads it: a string is markup."""
    return cell if isinstance(cell, Text) else Text.from_markup(cell)


def plain_text(cell) -> str:
    """What the cell shows, without making a Text of a plain string (a Text costs: 20,000 rows of 10 cells)."""
    return cell if plain_string(cell) else cell_text(cell).plain


def natural_width(column: Column) -> int:
    """The column's width with nothing folded: its widest cell or header on one line."""
    texts = [str(column.header), *(plain_text(c) for c in column.cells)]
    return max(cell_len(t) for t in texts)


def least_width(table: Table) -> int:
    """The narrowest the table prints with every column at its minimum and one space between columns (the box
    narrow_safe gives it: no edge, no padding)."""
    return sum(c.min_width or 0 for c in table.columns) + len(table.columns) - 1


def narrow_safe(table: Table, *wrapping: str, optional: tuple[str, ...] = ()) -> Fitted:
    """Only the `wrapping` columns (free text: offers, times) give way, folding between their words; every other
    column keeps its widest cell whole; lines between columns are dropped to leave them the room; the `optional`
    columns go, first named first, while the rest cannot fit."""
    table.box, table.show_edge, table.padding = box.SIMPLE_HEAD, False, (0, 0)
    for column in table.columns:
        cells = [plain_text(c) for c in column.cells]
        if column.header in wrapping:  # the header and cells may wrap between their words
            column.no_wrap, column.overflow = False, "fold"
            words = [w for t in [str(column.header), *cells] for w in t.split()]
        else:  # rich then shrinks only the folding columns
            column.no_wrap = True
            words = [str(column.header), *cells]
        column.min_width = max(cell_len(w) for w in [*words, ""])
    return Fitted(table, optional)
