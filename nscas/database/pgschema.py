"""The schema of a team store's PostgreSQL database as fsck compares it with what the migrations
create: tables, columns, indexes and the insert-only triggers (nscas.database.revision has SQLite's).

Apart from nscas.database.postgres: only fsck needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nscas.database.revision import INDEXES, INSERT_ONLY_TABLES, TABLES, SchemaDifference

if TYPE_CHECKING:
    from nscas.database.connections import Connection

GUARD_FUNCTION = "nscas_insert_only"
"""The trigger function the migrations create for the insert-only tables on PostgreSQL."""

# Index names PostgreSQL gives keys and UNIQUE constraints (SQLite's are sqlite_autoindex_*).
PG_INDEXES: dict[str, str] = {
    **{name: table for name, table in INDEXES.items() if not name.startswith("sqlite_")},
    "alembic_version_pkc": "alembic_version", "objects_pkey": "objects",
    "objects_id_key": "objects", "parts_pkey": "parts", "links_pkey": "links",
    "object_sha256_pkey": "object_sha256", "refs_pkey": "refs", "ref_log_pkey": "ref_log",
    "gc_session_pkey": "gc_session",
}
TRUNCATE_FUNCTION = "nscas_no_truncate"
"""The statement-level trigger function that refuses TRUNCATE of an insert-only table (0004)."""
PG_TRIGGERS = {f"{t}_no_{v}": (t, v.upper())
               for t in INSERT_ONLY_TABLES for v in ("update", "delete", "truncate")}
GUARD_BODIES = {
    GUARD_FUNCTION: "BEGIN IF EXISTS (SELECT 1 FROM gc_session) THEN IF TG_OP = 'DELETE' THEN "
                    "RETURN OLD; END IF; RETURN NEW; END IF; RAISE EXCEPTION USING MESSAGE = "
                    "TG_TABLE_NAME || ' is insert-only'; END",
    TRUNCATE_FUNCTION: "BEGIN RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME || ' is insert-only'; END",
}
"""Each guard function's body (``pg_proc.prosrc``, whitespace collapsed) as migrations 0001 and
0004 create it: a body replaced with ``CREATE OR REPLACE FUNCTION`` switches every guard off."""


def schema_differences(c: Connection) -> list[SchemaDifference]:
    """The PostgreSQL form of :func:`nscas.database.revision.schema_differences`: tables, columns,
    indexes and the insert-only triggers (each calling :data:`GUARD_FUNCTION` before its verb)."""
    columns: dict[str, set[str]] = {}
    for table, column in c.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema()"):
        columns.setdefault(table, set()).add(column)
    out: list[SchemaDifference] = []
    for table, wanted in TABLES.items():
        if table not in columns:
            out.append(SchemaDifference(name=table, problem="missing-table",
                                        detail=f"table {table} is missing"))
            continue
        out.extend(SchemaDifference(name=f"{table}.{col}", problem="missing-column",
                                    detail=f"column {col} of table {table} is missing")
                   for col in wanted if col not in columns[table])
    gone = {d.name for d in out if d.problem == "missing-table"}
    indexes = {name for (name,) in c.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}
    out.extend(SchemaDifference(name=index, problem="missing-index",
                                detail=f"index {index} on {table} is missing")
               for index, table in PG_INDEXES.items() if index not in indexes and table not in gone)
    triggers = {name: (table, sql, enabled) for name, table, sql, enabled in c.execute(
        "SELECT t.tgname, r.relname, pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t "
        "JOIN pg_class r ON r.oid = t.tgrelid JOIN pg_namespace n ON n.oid = r.relnamespace "
        "WHERE NOT t.tgisinternal AND n.nspname = current_schema()")}
    for name, (table, verb) in PG_TRIGGERS.items():
        found = triggers.get(name)
        if found is None:
            if table not in gone:
                out.append(SchemaDifference(name=name, problem="missing-trigger",
                                            detail=f"trigger {name} is missing: {table} is no "
                                                   "longer insert-only"))
        elif found[1] != guard_trigger_def(table, verb):
            out.append(SchemaDifference(name=name, problem="changed-trigger",
                                        detail=f"trigger {name} is not the one the migrations "
                                               f"create: {found[1]}"))
        elif found[2] != "O":  # D: disabled; R: fires only in replica sessions; A: always
            out.append(SchemaDifference(name=name, problem="disabled-trigger",
                                        detail=f"trigger {name} is disabled (tgenabled "
                                               f"{found[2]!r}, not 'O'): {table} is no longer "
                                               "insert-only"))
    out.extend(_guard_function_differences(c))
    for name, (table, sql, _) in sorted(triggers.items()):
        if name not in PG_TRIGGERS:
            out.append(SchemaDifference(name=name, problem="extra-trigger",
                                        detail=f"trigger {name} on {table}, which no migration "
                                               f"creates: {sql}"))
    out.extend(SchemaDifference(name=t, problem="extra-object", harmful=False,
                                detail=f"table {t}, which no migration creates")
               for t in sorted(set(columns) - set(TABLES)))
    out.extend(SchemaDifference(name=i, problem="extra-object", harmful=False,
                                detail=f"index {i}, which no migration creates")
               for i in sorted(indexes - set(PG_INDEXES)))
    if "gc_session" not in gone and c.execute("SELECT 1 FROM gc_session").fetchone():
        out.append(SchemaDifference(name="gc_session", problem="gc-session-open",
                                    detail="gc_session holds a row outside any gc: the "
                                           "insert-only tables accept updates and deletes"))
    return out


def _guard_function_differences(c: Connection) -> list[SchemaDifference]:
    """The guard functions against :data:`GUARD_BODIES`: missing, another language, another
    body, or more than one of a name (an overload the triggers might resolve to instead)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for name, language, body in c.execute(
            "SELECT p.proname, l.lanname, p.prosrc FROM pg_proc p "
            "JOIN pg_language l ON l.oid = p.prolang JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname IN (?, ?)",
            (GUARD_FUNCTION, TRUNCATE_FUNCTION)):
        found.setdefault(name, []).append((language, " ".join(str(body).split())))
    out: list[SchemaDifference] = []
    for name, body in GUARD_BODIES.items():
        have = found.get(name, [])
        if not have:
            out.append(SchemaDifference(name=f"{name}()", problem="missing-function",
                                        detail=f"guard function {name}() is missing"))
        elif have != [("plpgsql", body)]:
            shown = "; ".join(f"{lang}: {text[:200]}" for lang, text in have)
            out.append(SchemaDifference(name=f"{name}()", problem="changed-function",
                                        detail=f"guard function {name}() is not the one the "
                                               f"migrations create: {shown}"))
    return out


def guard_trigger_def(table: str, verb: str) -> str:
    """``pg_get_triggerdef`` of the insert-only trigger on ``table`` for ``verb``: per row for
    UPDATE and DELETE (gc's session lets them through), per statement for TRUNCATE (never)."""
    if verb == "TRUNCATE":
        return (f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON public.{table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {TRUNCATE_FUNCTION}()")
    return (f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON public.{table} "
            f"FOR EACH ROW EXECUTE FUNCTION {GUARD_FUNCTION}()")
