"""Tables that fit the terminal they are printed in: numbers and ids stay whole, free text folds, and when even
that is too wide the columns a reader needs least are left out (in the order the table names them)."""

from __future__ import annotations

import copy

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Column, Table
from rich.text import Text


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


def natural_width(column: Column) -> int:
    """The column's width with nothing folded: its widest cell or header on one line."""
    texts = [str(column.header), *(Text.from_markup(c).plain if isinstance(c, str) else c.plain for c in column.cells)]
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
        cells = [Text.from_markup(c) if isinstance(c, str) else c for c in column.cells]
        if column.header in wrapping:  # the header and cells may wrap between their words
            column.no_wrap, column.overflow = False, "fold"
            words = [w for t in [str(column.header), *(c.plain for c in cells)] for w in t.split()]
        else:  # rich then shrinks only the folding columns
            column.no_wrap = True
            words = [str(column.header), *(c.plain for c in cells)]
        column.min_width = max(cell_len(w) for w in [*words, ""])
    return Fitted(table, optional)
