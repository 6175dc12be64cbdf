"""An index of the links that name a run's outputs, for finding an object's producers.

The receipts that produced an object are the parents of its ``$.outputs`` links
(``nscas.store.provenance``). An object shared as an input (an environment, a code tree) has links
from hundreds of thousands of records, almost none of them outputs: through ``ix_links_child``
that lookup walks them all. A partial index over the ``$.outputs`` links alone (one or a few per
receipt) makes it a lookup. Queries name its condition as written here, so that both engines
use it.

Revision ID: 0005_producer_links
Revises: 0004_no_truncate
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_producer_links"
down_revision = "0004_no_truncate"
branch_labels = None
depends_on = None

OUTPUTS = "substr(path, 1, 9) = '$.outputs'"


def upgrade() -> None:
    op.create_index("ix_links_outputs", "links", ["child", "parent", "path"],
                    sqlite_where=sa.text(OUTPUTS), postgresql_where=sa.text(OUTPUTS))


def downgrade() -> None:
    op.drop_index("ix_links_outputs", table_name="links")
