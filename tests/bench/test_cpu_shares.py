"""bench/cpu_shares.py: which PostgreSQL processes count for a bench's own database."""

import pytest

from bench.cpu_shares import postgres_counts

DB = "attune_h2_fleet"


@pytest.mark.parametrize(
    ("title", "counts"),
    [
        (f"postgres: 15/main: postgres {DB} 127.0.0.1(49200) idle", True),
        (f"postgres: 15/main: postgres {DB} [local] idle in transaction", True),
        (f"postgres: 15/main: autovacuum worker {DB}", True),
        ("postgres: 15/main: walwriter ", True),
        ("postgres: 15/main: checkpointer ", True),
        ("/usr/lib/postgresql/15/bin/postgres -D /var/lib/postgresql/15/main -c config_file=x", True),
        ("postgres: 15/main: postgres attune_h1_bench 127.0.0.1(44770) idle", False),
        (f"postgres: 15/main: postgres {DB}_copy 127.0.0.1(1) idle", False),  # a name that starts alike
        ("postgres: 15/main: autovacuum worker test_attune_h4", False),
    ],
)
def test_a_bench_counts_its_own_sessions_and_the_servers_background_work(title, counts):
    assert postgres_counts(title, DB) is counts
    assert postgres_counts(title, None)  # without a database, every process counts
