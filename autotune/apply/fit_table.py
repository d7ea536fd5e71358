"""A rich table that fits the width it is printed at: an 80-column terminal, a log file, a wide screen.

rich squeezes a table that is too wide by wrapping its widest cells, down to one character per line,
which turns a leaderboard into a column of letters. Here the table keeps every column on one line
while they fit; when they do not, the short columns stay a table (one line per row) and the long
ones are printed under their row, indented, wrapping at spaces like prose.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

INDENT = 4  # the long cells under a row start here, so the row's own line stands out
UNBOUNDED = 100_000  # columns: a width no table reaches, to measure one unsqueezed


class FitTable:
    """`columns` head `rows` of text cells; `long` names the columns that go under their row when the
    table does not fit; `left` the columns aligned left (the others are figures, aligned right)."""

    def __init__(
        self,
        title: str,
        columns: Sequence[str],
        rows: Iterable[Sequence[str]],
        *,
        long: Sequence[str] = (),
        left: Sequence[str] = (),
    ) -> None:
        self.title, self.columns, self.rows = title, tuple(columns), [tuple(r) for r in rows]
        self.long, self.left = frozenset(long), frozenset(left) | frozenset(long)

    def wide(self) -> Table:
        """Every column, every cell on one line: only printed where it fits."""
        table = Table(title=self.title)
        for col in self.columns:
            table.add_column(col, justify="left" if col in self.left else "right", no_wrap=True)
        for row in self.rows:
            table.add_row(*(Text(c) for c in row))  # Text: a cell is never read as rich markup
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.wide()
        natural = Measurement.get(console, options.update_width(UNBOUNDED), table).maximum  # get() clamps to the width
        if natural <= options.max_width:
            yield table
        else:
            yield from self.narrow()

    def narrow(self) -> Iterator[Text | Padding]:
        """The short columns as aligned text, one line per row, and each long cell under its row."""
        short = [i for i, c in enumerate(self.columns) if c not in self.long]
        widths = {i: max([cell_len(self.columns[i]), *(cell_len(r[i]) for r in self.rows)]) for i in short}

        def line(cells: Sequence[str], style: str = "") -> Text:
            parts = [
                cells[i].ljust(widths[i]) if self.columns[i] in self.left else cells[i].rjust(widths[i]) for i in short
            ]
            return Text("  ".join(parts).rstrip(), style=style)

        yield Text(self.title, style="italic")
        yield line(self.columns, "bold")
        for row in self.rows:
            yield line(row)
            for i, col in enumerate(self.columns):
                if col in self.long and row[i]:
                    yield Padding(Text(f"{col}: {row[i]}"), (0, 0, 0, INDENT), expand=False)
