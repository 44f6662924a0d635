"""Writing the catalog index: a batch of items in one transaction, and a writer thread for bulk loads.

A batch goes in with a handful of statements, each writing thousands of rows at once
(``INSERT ... VALUES (?,..),(?,..),...``, ``... WHERE id IN (?,?,...)``). Python's sqlite3 holds
the GIL while it binds a statement and releases it while SQLite runs it (``sqlite3_step``), so
:class:`BatchWriter`'s thread, running few large statements, leaves the caller's thread free to
build the next batch meanwhile. ``executemany`` would take the GIL back for every row: beside a
thread busy in Python, each row then waits out the interpreter's switch interval (5 ms; 200 R*Tree
rows took 2.4 s instead of 2 ms).

R*Tree rows go in in the Morton (Z) order of their boxes' centres, so consecutive inserts descend
to the same nodes while SQLite has them cached (1M items, ``bench/catalog.py``'s items in 10,000-item
batches: R*Tree inserts 34 -> 26 µs per item, commits 10 -> 6 µs, as fewer pages change per batch).
The tree holds the same boxes; only its node layout differs from insertion in item order.

SQLite errors leave a transaction as :class:`CatalogError` naming the index file, a damaged file
(``SQLITE_CORRUPT``, ``SQLITE_NOTADB``) as :class:`CorruptIndexError`.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import queue
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cubelake.errors import CatalogError, CorruptIndexError

from ._bandsets import BandSet

__all__ = ["BatchPlan", "BatchWriter", "Box", "Rows", "connect", "delete_rows", "index_error", "morton_order",
           "param_limit", "plan_batch", "rowids_of", "transaction", "write_plan", "write_rows"]

_MMAP_BYTES = 16 * 1024**3  # address space only; the OS pages in what searches touch
_CACHE_KIB = 64 * 1024  # searches read pages at random: keep 64 MiB of them
_CHUNK_ROWS = 4096  # rows (or ids) per statement at most; SQLite's parameter limit may allow fewer
_ITEM_COLUMNS = ("rowid, id, collection, datetime, t0, t1, west, south, east, north, geometry, band_count, href, "
                 "properties, band_set")


Box = tuple[float, float, float, float, float, float]  # an R*Tree box: (minx, maxx, miny, maxy, mint, maxt)


@dataclass(slots=True)
class Rows:
    """Everything the index stores for one item (see ``index.index_rows``).

    Tuples, not lists: a batch lives through many garbage collections, and the collector stops
    tracking tuples of plain values (at a million items, fewer tracked objects per item meant
    fewer and shorter full collections).
    """

    item: tuple[Any, ...]  # the items row from id to properties (rowid and band set come at writing)
    boxes: tuple[Box, ...]
    band_set: BandSet
    cells: tuple[str, ...]
    queryables: dict[str, str]


def _busy_or(path: Path, exc: sqlite3.Error) -> str:
    if "locked" in str(exc) or "busy" in str(exc):
        return (f"{path}: the catalog index stayed locked by another process for 60 s ({exc}); "
                "a long ingest or reindex holds it: try again when it is done")
    return f"{path}: the catalog index cannot be used ({exc}); rebuild it with 'cubelake catalog reindex'"


def is_corrupt(exc: sqlite3.Error) -> bool:
    """SQLite says the file is damaged or not a database (flipped pages, a truncated or foreign file)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def index_error(path: Path, exc: sqlite3.Error) -> CatalogError:
    """The :class:`CatalogError` for an SQLite error on the index at ``path`` (corruption: ``CorruptIndexError``)."""
    if is_corrupt(exc):
        return CorruptIndexError(f"{path}: the catalog index is damaged ({exc})")
    return CatalogError(_busy_or(path, exc))


def connect(path: Path, *, readonly: bool = False, check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection to the index file with the index's settings (autocommit, 60 s busy timeout, mapped file)."""
    if readonly:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60, isolation_level=None,
                             check_same_thread=check_same_thread)
    else:
        db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=check_same_thread)
    try:
        db.execute("PRAGMA busy_timeout=60000")
        # searches read pages at random: map the file (no read() per page) and keep some pages cached
        db.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")
        db.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
    except BaseException:
        db.close()
        raise
    return db


@contextlib.contextmanager
def transaction(db: sqlite3.Connection, path: Path) -> Iterator[sqlite3.Connection]:
    """One write transaction (``BEGIN IMMEDIATE``) on ``db``: all of it or none of it."""
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise index_error(path, exc) from exc
    try:
        yield db
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error):  # a damaged file can refuse the rollback too
            db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            if is_corrupt(exc):
                raise index_error(path, exc) from exc
            raise CatalogError(f"{path}: writing the catalog index failed ({exc})") from exc
        raise
    try:
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        raise index_error(path, exc) from exc


# -- statements of many rows -----------------------------------------------------------------------------
def param_limit(db: sqlite3.Connection) -> int:
    """SQLite's limit on parameters per statement for ``db``."""
    return int(db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))


def _per(limit: int, width: int, reserved: int = 0) -> int:
    """Rows of ``width`` values one statement takes (``reserved`` parameters aside)."""
    return max(1, min(_CHUNK_ROWS, (limit - reserved) // width))


def _in(n: int) -> str:
    return f"IN ({','.join('?' * n)})"


def rowids_of(db: sqlite3.Connection, ids: Sequence[str]) -> list[int]:
    """The rowids of those of ``ids`` that the index holds."""
    out: list[int] = []
    per = _per(param_limit(db), 1)
    for k in range(0, len(ids), per):
        part = list(ids[k:k + per])
        out += [r for (r,) in db.execute(f"SELECT rowid FROM items WHERE id {_in(len(part))}", part)]
    return out


def delete_rows(db: sqlite3.Connection, rowids: Sequence[int]) -> None:
    """Remove items and every row that refers to them (their band sets stay: others may share them)."""
    per = _per(param_limit(db), 2)
    for k in range(0, len(rowids), per):
        part = list(rowids[k:k + per])
        db.execute(f"DELETE FROM items_rtree WHERE id {_in(2 * len(part))}", [i for r in part for i in (r * 2, r * 2 + 1)])
        db.execute(f"DELETE FROM geohash WHERE item {_in(len(part))}", part)
        db.execute(f"DELETE FROM items WHERE rowid {_in(len(part))}", part)


@dataclass(slots=True)
class _Statement:
    sql: str
    params: list[Any]
    first_times: int = 0  # >0: ?1 (params[0]) is the batch's first rowid times this, set when writing
    width: int = 1  # values per row
    band_set_at: int = -1  # >=0: each row's value there is a band set digest, replaced by its id when writing


@dataclass(slots=True)
class BatchPlan:
    """A batch's statements, all parameters bound but the first rowid (known under the write lock only).

    Built by :func:`plan_batch` outside the transaction (in a bulk load, in the caller's thread),
    run by :func:`write_plan`: the writer then does next to nothing in Python, which matters when
    it shares the GIL with a thread busy in Python (every time it wants the GIL back it may wait
    out the 5 ms switch interval).
    """

    lookups: list[_Statement]  # the rowids of the batch's ids that the index holds (to replace)
    band_sets: list[BandSet]  # distinct, in order of first appearance
    inserts: list[_Statement]


def _values(head: str, select: str, width: int, values: list[Any], limit: int,
            first_times: int = 0, band_set_at: int = -1) -> list[_Statement]:
    """``head SELECT select FROM (VALUES (?,..),...)``: rows of ``width`` values, one after the other in
    ``values``, in a few statements. ``select`` names them ``column1`` ...; ``?1`` is the first rowid
    (times ``first_times``) where that is not 0."""
    one = f"({','.join('?' * width)})"
    reserved = 1 if first_times else 0
    per = _per(limit, width, reserved)
    out = []
    for k in range(0, len(values), per * width):
        part = values[k:k + per * width]
        sql = f"{head} SELECT {select} FROM (VALUES {','.join([one] * (len(part) // width))})"
        out.append(_Statement(sql, [None, *part] if reserved else part, first_times, width, band_set_at))
    return out


def _columns(first: int, last: int) -> str:
    return ", ".join(f"column{k}" for k in range(first, last + 1))


# (the band set digest of a row is replaced by the set's id in the writer: a subquery per row cost
# 1-2 µs more per row)
_ITEMS_INSERT = (f"INSERT INTO items({_ITEM_COLUMNS})",  # rowid less the first, 13 values, band set
                 f"?1 + column1, {_columns(2, 15)}", 15)
_RTREE_INSERT = ("INSERT INTO items_rtree",  # id less the first rowid x 2, the box, band set
                 f"?1 + column1, {_columns(2, 8)}", 8)
_GEOHASH_INSERT = ("INSERT OR IGNORE INTO geohash", "column1, ?1 + column2", 2)


def plan_batch(rows: Sequence[Rows], limit: int) -> BatchPlan:
    """The statements that insert (or replace) items with distinct ids; ``limit``: SQLite's parameter limit."""
    ids = [r.item[0] for r in rows]
    per = _per(limit, 1)
    lookups = [_Statement(f"SELECT rowid FROM items WHERE id {_in(len(ids[k:k + per]))}", ids[k:k + per])
               for k in range(0, len(ids), per)]
    band_sets = list({r.band_set.digest: r.band_set for r in rows}.values())
    # parameter lists built flat (append/extend): a tuple per row and a flattening pass cost 3x as much
    values: list[Any] = []
    add, extend = values.append, values.extend
    for k, r in enumerate(rows):
        add(k)
        extend(r.item)
        add(r.band_set.digest)
    inserts = _values(*_ITEMS_INSERT, values, limit, first_times=1, band_set_at=14)
    boxes = [b for r in rows for b in r.boxes]
    box_ids = [k * 2 + p for k, r in enumerate(rows) for p in range(len(r.boxes))]  # rowid*2 + part, less 2*first
    box_sets = [r.band_set.digest for r in rows for _ in r.boxes]
    values = []
    add, extend = values.append, values.extend
    for i in morton_order(boxes):
        add(box_ids[i])
        extend(boxes[i])
        add(box_sets[i])
    inserts += _values(*_RTREE_INSERT, values, limit, first_times=2, band_set_at=7)
    inserts += _values(*_GEOHASH_INSERT, [v for k, r in enumerate(rows) for c in r.cells for v in (c, k)],
                       limit, first_times=1)
    pairs = set(itertools.chain.from_iterable(map(dict.items, map(operator.attrgetter("queryables"), rows))))
    inserts += _values("INSERT OR IGNORE INTO queryables", "column1, column2", 2,
                       list(itertools.chain.from_iterable(sorted(pairs))), limit)
    return BatchPlan(lookups, band_sets, inserts)


def band_set_ids(db: sqlite3.Connection, sets: list[BandSet]) -> dict[bytes, int]:
    """Each band set's id in this index (added, with its coverage, where missing); in a transaction."""
    out: dict[bytes, int] = {}
    per = _per(param_limit(db), 1)
    for k in range(0, len(sets), per):
        part = [bs.digest for bs in sets[k:k + per]]
        out.update(db.execute(f"SELECT digest, id FROM band_sets WHERE digest {_in(len(part))}", part))
    for bs in sets:
        if bs.digest not in out:
            bid = int(db.execute("INSERT INTO band_sets(digest, names, center_nm, fwhm_nm) VALUES (?,?,?,?)",
                                 bs.row).lastrowid or 0)
            for st in _values("INSERT OR IGNORE INTO band_coverage", "column1, column2, column3", 3,
                              [v for lo, hi in bs.coverage for v in (bid, lo, hi)], param_limit(db)):
                db.execute(st.sql, st.params)
            out[bs.digest] = bid
    return out


def write_plan(db: sqlite3.Connection, plan: BatchPlan) -> None:
    """Run a batch's statements; in a transaction (see :func:`transaction`)."""
    replaced = [r for st in plan.lookups for (r,) in db.execute(st.sql, st.params)]
    if replaced:
        delete_rows(db, replaced)
    ids = band_set_ids(db, plan.band_sets)
    # rowids as SQLite would give them (max + 1): the write lock is held, nobody else inserts
    first = int(db.execute("SELECT coalesce(max(rowid), 0) + 1 FROM items").fetchone()[0])
    for st in plan.inserts:
        params = st.params
        if st.first_times:
            params[0] = first * st.first_times
        if st.band_set_at >= 0:
            at = st.band_set_at + (1 if st.first_times else 0)
            params[at::st.width] = [ids[d] for d in params[at::st.width]]
        db.execute(st.sql, params)


def write_rows(db: sqlite3.Connection, rows: Sequence[Rows]) -> None:
    """Insert (or replace) items with distinct ids; in a transaction (see :func:`transaction`)."""
    write_plan(db, plan_batch(rows, param_limit(db)))


def _spread16(v: np.ndarray) -> np.ndarray:
    """16-bit integers with a zero bit inserted above each bit (``abcd`` -> ``0a0b0c0d``)."""
    v = (v | (v << 8)) & 0x00FF00FF
    v = (v | (v << 4)) & 0x0F0F0F0F
    v = (v | (v << 2)) & 0x33333333
    return (v | (v << 1)) & 0x55555555


def morton_order(boxes: Sequence[Sequence[float]]) -> list[int]:
    """Indices of R*Tree boxes ``(minx, maxx, miny, maxy, ...)`` (degrees) in Z order of their centres.

    Centres are quantised to 65,536 steps per axis (~0.005 deg); ties keep their order.
    """
    n = len(boxes)
    if n < 2:
        return list(range(n))
    a = np.fromiter(itertools.chain.from_iterable(b[:4] for b in boxes), dtype=np.float64, count=4 * n)
    a = np.nan_to_num(a.reshape(n, 4))
    x = np.clip(((a[:, 0] + a[:, 1]) * 0.5 + 180.0) * (65535.0 / 360.0), 0, 65535).astype(np.int64)
    y = np.clip(((a[:, 2] + a[:, 3]) * 0.5 + 90.0) * (65535.0 / 180.0), 0, 65535).astype(np.int64)
    return np.argsort(_spread16(x) | (_spread16(y) << 1), kind="stable").tolist()


# -- the writer thread -----------------------------------------------------------------------------------
class BatchWriter:
    """Writes batches on a thread of its own, each in one transaction, in the order submitted.

    ``db`` (opened with ``check_same_thread=False``) is the writer's alone from here on; it closes it.
    One batch is in flight at most: :meth:`submit` waits until the one before is written, so a
    failed batch stops every later one, as writing them one after the other would. The first
    failure is raised by the next :meth:`submit` or by :meth:`finish`; :meth:`close` (always
    call it) waits for the batch in flight, committed or rolled back, and ends the thread.
    """

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db, self._path = db, path
        self._inbox: queue.Queue[BatchPlan | None] = queue.Queue(maxsize=1)
        self.failure: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"index writer {path.name}", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            db.close()
            raise

    def _run(self) -> None:
        try:
            while (plan := self._inbox.get()) is not None:
                try:
                    if self.failure is None:
                        with transaction(self._db, self._path):
                            write_plan(self._db, plan)
                except BaseException as exc:  # handed to the caller's thread by submit/finish
                    self.failure = exc
                finally:
                    self._inbox.task_done()
        finally:
            self._db.close()

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def submit(self, plan: BatchPlan) -> None:
        """Write a batch once the one before is written; raises that one's failure."""
        self._inbox.join()
        self._raise_failure()
        self._inbox.put(plan)

    def finish(self) -> None:
        """Wait until every batch is written; raises the first failure."""
        self._inbox.join()
        self._raise_failure()

    def close(self) -> None:
        """End the thread after the batch in flight (idempotent)."""
        if not self._closed:
            self._closed = True
            self._inbox.put(None)
            self._thread.join()
