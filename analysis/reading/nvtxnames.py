"""NVTX range names as the report SQL of each nsys version builds them.

2025.3.1 names every range ``coalesce(domain, '') || ':' || coalesce(StringIds.value,
text, '')`` (default-domain ranges print as ``:name``) and resolves the domain name
through StringIds too; 2024.2.3 prints ``domain:name`` for named domains and the bare
name otherwise (NULL without any text).  A range's domain is the first
NVTX_DOMAIN_CREATE event of its ``domainId`` in the same process.
"""

from __future__ import annotations

import numpy as np

from analysis.reading.codes import dense_codes
from analysis.reading.database import Database
from analysis.reading.sqlitefile import NULL

NVTX = "NVTX_EVENTS"
NVTX_DOMAIN_CREATE = 75
PID_BITS = 0x0000FFFFFF000000  # globalTid -> process part (domains are per process)
Domains = dict[tuple[int, int], tuple[int, "str | None"]]


def column_or_null(db: Database, column: str) -> str:
    """``column`` where NVTX_EVENTS has it (the schema varies by version), else NULL."""
    return column if column in db.columns_of(NVTX) else "NULL"


def nvtx_domains(db: Database, version: str) -> Domains:
    """First NVTX_DOMAIN_CREATE per (domainId, process): (start, domain name)."""
    textid, domainid, text = (column_or_null(db, c) for c in ("textId", "domainId", "text"))
    rows = db.query(
        f"SELECT start, globalTid, {textid}, {domainid}, {text} FROM {NVTX} "
        f"WHERE eventType = {NVTX_DOMAIN_CREATE}"
    )
    strings = db.strings
    domains: Domains = {}
    for start, gtid, text_id, dom, dname in rows:
        if dom is None or gtid is None:
            continue
        key = (dom, gtid & PID_BITS)
        if version == "2025" and text_id is not None and strings.get(text_id) is not None:
            dname = strings[text_id]
        if key not in domains or start < domains[key][0]:
            domains[key] = (start, dname)
    return domains


def range_name(
    text_id: int | None,
    text: str | None,
    dom: int | None,
    gtid: int | None,
    strings: dict[int, str],
    domains: Domains,
    version: str,
) -> str | None:
    """The name of one range as nsys ``version`` prints it (see the module docstring)."""
    value = strings.get(text_id) if text_id is not None else None
    label = value if value is not None else text
    dname = None
    if domains and dom is not None and gtid is not None:
        hit = domains.get((dom, gtid & PID_BITS))
        dname = hit[1] if hit else None
    if version == "2025":
        return f"{dname or ''}:{label or ''}"
    if dname is not None:
        return None if label is None else f"{dname}:{label}"
    return label


def text_codes(db: Database, where: str, rowid: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
    """Per range (in ``rowid`` order): index into the distinct inline texts (0 = NULL)."""
    codes = np.zeros(rowid.size, np.int64)
    texts: list[str | None] = [None]
    if "text" not in db.columns_of(NVTX):
        return codes, texts
    rows = db.query(f"SELECT rowid, text FROM {NVTX} {where} AND text IS NOT NULL")
    if rows:
        index: dict[str, int] = {}
        ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
        code = np.fromiter(
            (index.setdefault(r[1], len(index) + 1) for r in rows), np.int64, len(rows)
        )
        texts += list(index)
        codes[np.searchsorted(rowid, ids)] = code
    return codes, texts


def name_codes(
    db: Database,
    version: str,
    text_id: np.ndarray,
    domain_id: np.ndarray,
    global_tid: np.ndarray,
    text_code: np.ndarray,
    texts: list[str | None],
) -> tuple[np.ndarray, list[str | None]]:
    """Per range: index into the distinct names, and those names.

    Names are built once per distinct (textId, text, domainId, process), not per row.
    """
    if text_id.size == 0:
        return np.empty(0, np.int64), []
    pid = np.where(global_tid == NULL, NULL, global_tid & PID_BITS)
    uniques, inverse = [], []
    for k in (text_id, text_code, domain_id, pid):
        u, inv = np.unique(k, return_inverse=True)
        uniques.append(u)
        inverse.append(inv.reshape(-1).astype(np.int64))
    combo, first = dense_codes(*inverse)
    strings = db.strings
    domains = nvtx_domains(db, version)
    names: list[str | None] = []
    index: dict[str | None, int] = {}
    combo_name = np.empty(first.size, np.int64)
    for c, row in enumerate(first.tolist()):
        tid_, tcode, dom, p = (int(u[inv[row]]) for u, inv in zip(uniques, inverse, strict=True))
        name = range_name(
            _opt(tid_), texts[tcode], _opt(dom), _opt(p), strings, domains, version
        )
        combo_name[c] = index.setdefault(name, len(names))
        if combo_name[c] == len(names):
            names.append(name)
    return combo_name[combo], names


def _opt(v: int) -> int | None:
    return None if v == NULL else v
