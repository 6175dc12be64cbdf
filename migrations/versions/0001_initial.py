"""The initial store schema: objects, parts, links, refs, the ref log, insert-only triggers.

Revision ID: 0001_initial
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

INSERT_ONLY = ("objects", "parts", "links", "ref_log")

# PostgreSQL's triggers cannot hold a subquery in WHEN: one function checks gc_session for all of
# them (a row there only inside gc's own transaction, invisible to every other connection).
PG_GUARD_FUNCTION = (
    "CREATE FUNCTION nscas_insert_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF EXISTS (SELECT 1 FROM gc_session) THEN "
    "IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END IF; "
    "RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME || ' is insert-only'; END $$"
)


def _guard(table: str) -> None:
    """Abort UPDATE and DELETE on ``table`` unless gc's session row exists."""
    for verb in ("UPDATE", "DELETE"):
        if op.get_bind().dialect.name == "postgresql":
            op.execute(f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                       f"FOR EACH ROW EXECUTE FUNCTION nscas_insert_only()")
        else:
            op.execute(
                f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                f"WHEN NOT EXISTS (SELECT 1 FROM gc_session) "
                f"BEGIN SELECT RAISE(ABORT, '{table} is insert-only'); END"
            )


def upgrade() -> None:
    op.create_table(
        "objects",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.CHAR(64), nullable=False, unique=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.CHAR(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=True),
        sa.Column("storage", sa.String(8), nullable=False),
        sa.Column("codec", sa.String(8), nullable=False, server_default="raw"),
        sa.Column("stored_size", sa.BigInteger, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=True),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_index(
        "ix_objects_records", "objects", ["kind", "seq"], sqlite_where=sa.text("kind IS NOT NULL"),
        postgresql_where=sa.text("kind IS NOT NULL"),
    )
    op.create_table(
        "parts",
        sa.Column("object_id", sa.CHAR(64), sa.ForeignKey("objects.id"), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("part_id", sa.CHAR(64), sa.ForeignKey("objects.id"), nullable=False),
    )
    op.create_index("ix_parts_part", "parts", ["part_id"])
    op.create_table(
        "links",
        sa.Column("parent", sa.CHAR(64), sa.ForeignKey("objects.id"), primary_key=True),
        sa.Column("path", sa.Text, primary_key=True),
        sa.Column("child", sa.CHAR(64), sa.ForeignKey("objects.id"), nullable=False),
    )
    op.create_index("ix_links_child", "links", ["child"])
    op.create_table(
        "refs",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("target", sa.CHAR(64), sa.ForeignKey("objects.id"), nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_table(
        "ref_log",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("old", sa.CHAR(64), nullable=True),
        sa.Column("new", sa.CHAR(64), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
    )
    op.create_index("ix_ref_log_name", "ref_log", ["name", "seq"])
    op.create_table("gc_session", sa.Column("token", sa.Integer, primary_key=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_GUARD_FUNCTION)
    for table in INSERT_ONLY:
        _guard(table)


def downgrade() -> None:
    for table in INSERT_ONLY:
        for verb in ("update", "delete"):
            on = f" ON {table}" if op.get_bind().dialect.name == "postgresql" else ""
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{verb}{on}")
    for table in ("gc_session", "ref_log", "refs", "links", "parts", "objects"):
        op.drop_table(table)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS nscas_insert_only()")
