"""A Parquet file of jets (one row a jet, particles as list columns: JetClass-II's files, what
weaver's `convert_to_parquet` and `ak.to_parquet(tree.arrays())` write) read through the
interface voxjet reads a ROOT tree by (`iterate`, `num_entries`, `name in table`, `keys()`):
columns by name, entries by row group, so a shard job reading a share of a file decompresses
only the row groups that hold it.

Parquet columns are nullable where ROOT branches never are: a column without a null is read as
the ROOT branch would be (`var * float32`, not `option[var * ?float32]`), one with a null is
refused naming the column and the first entry holding it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import awkward as ak
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from voxjet.errors import VoxjetError

SUFFIX = ".parquet"


def is_parquet(name: str | Path) -> bool:
    """Whether a file is read as Parquet (by its name, as weaver tells its formats apart)."""
    return str(name).lower().endswith(SUFFIX)


@dataclass(frozen=True)
class Report:
    """The entries a step holds (uproot's report names)."""

    tree_entry_start: int
    tree_entry_stop: int


def _readable(t: pa.DataType) -> bool:
    """Numbers, booleans, and lists (of lists) of them: what a ROOT branch of jets holds."""
    if _nested(t):
        return _readable(t.value_type)
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _not_null(t: pa.DataType) -> pa.DataType:
    """The type with every level non-nullable (awkward then reads no option type)."""
    if pa.types.is_large_list(t):
        return pa.large_list(pa.field("item", _not_null(t.value_type), nullable=False))
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field("item", _not_null(t.value_type), nullable=False))
    return t


def _levels(values: pa.Array) -> list[pa.Array]:
    """The array and each level of lists below it, flattened."""
    out = [values]
    while _nested(out[-1].type):
        out.append(out[-1].flatten())
    return out


def _first_null(col: pa.ChunkedArray) -> int | None:
    """The first row holding a null at any depth, None when there is none."""
    offset = 0
    for chunk in col.chunks:
        levels = _levels(chunk)
        if any(v.null_count for v in levels):
            rows, values = np.arange(len(chunk)), chunk
            while True:
                nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False), bool)
                if nulls.any():
                    return offset + int(rows[np.argmax(nulls)])
                rows = rows[pc.list_parent_indices(values).to_numpy()]
                values = values.flatten()
        offset += len(chunk)
    return None


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


class ParquetTable:
    """One Parquet file's columns and row groups, read as an uproot tree is."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.file = pq.ParquetFile(self.path)
        except Exception as e:
            raise VoxjetError(f"{self.path}: not a readable Parquet file ({type(e).__name__}: "
                              f"{e}); copy or produce it again") from e  # fmt: skip
        self.schema = self.file.schema_arrow
        meta = self.file.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self._schemas: dict[tuple[str, ...], pa.Schema] = {}

    def __enter__(self) -> ParquetTable:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes the file."""
        self.file.close()

    @property
    def num_entries(self) -> int:
        """The file's rows (jets)."""
        return int(self.group_starts[-1])

    def keys(self) -> list[str]:
        """The column names."""
        return list(self.schema.names)

    def __contains__(self, name: str) -> bool:
        return name in self.schema.names

    def column_type(self, name: str) -> str:
        """A column's type as awkward spells it (as io.trees.branch_type does a branch's)."""
        t = self.schema.field(name).type
        if not _readable(t):
            raise VoxjetError(f"{self.path}: column {name!r} is {t}; voxjet reads columns of "
                              "numbers, booleans and lists of them (one row a jet)")  # fmt: skip
        form = ak.from_arrow_schema(pa.schema([pa.field(name, _not_null(t), nullable=False)]))
        return str(form.contents[0].type)

    def _table(self, names: list[str], start: int, stop: int) -> ak.Array:
        """Rows [start, stop) of the named columns: only the row groups holding them read."""
        first = int(np.searchsorted(self.group_starts, start, side="right")) - 1
        last = int(np.searchsorted(self.group_starts, stop, side="left"))
        table = self.file.read_row_groups(list(range(first, last)), columns=names)
        offset = int(self.group_starts[first])
        table = table.slice(start - offset, stop - start)
        for name in names:
            row = _first_null(table.column(name))
            if row is not None:
                raise VoxjetError(
                    f"{self.path}: column {name!r} holds a null (a missing value) at entry "
                    f"{start + row}; fill it in the file, with a value jets.missing can "
                    "declare (e.g. -999), or drop such jets"
                )
        return ak.from_arrow(table.select(names).cast(self._non_null(tuple(names))))

    def _non_null(self, names: tuple[str, ...]) -> pa.Schema:
        """The columns' schema without nullability (checked readable), made once a name set:
        every step of a file reads the same columns."""
        if names not in self._schemas:
            for name in names:
                self.column_type(name)  # a column of text or records: refused, named
            self._schemas[names] = pa.schema(
                [pa.field(n, _not_null(self.schema.field(n).type), nullable=False) for n in names]
            )
        return self._schemas[names]

    def arrays(self, names: list[str], entry_start: int = 0,
               entry_stop: int | None = None) -> ak.Array:  # fmt: skip
        """The named columns of entries [entry_start, entry_stop) as one awkward record array."""
        stop = self.num_entries if entry_stop is None else min(entry_stop, self.num_entries)
        return self._table(list(names), entry_start, max(stop, entry_start))

    def iterate(self, names: list[str], entry_start: int = 0, entry_stop: int | None = None,
                step_size: int = 50000, library: str = "ak",
                report: bool = False) -> Iterator:  # fmt: skip
        """Steps of about `step_size` entries (whole row groups, as weaver reads them), each
        with a Report of its entries when `report`."""
        if library != "ak":
            raise ValueError("ParquetTable.iterate gives awkward arrays only")
        stop = self.num_entries if entry_stop is None else min(entry_stop, self.num_entries)
        start = entry_start
        while start < stop:
            # the step ends at the row group boundary nearest past start + step_size
            i = int(np.searchsorted(self.group_starts, start + max(int(step_size), 1)))
            end = min(int(self.group_starts[min(i, len(self.group_starts) - 1)]), stop)
            end = end if end > start else stop
            arrays = self._table(list(names), start, end)
            yield (arrays, Report(start, end)) if report else arrays
            start = end
