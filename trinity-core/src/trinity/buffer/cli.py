"""``trinity buffer show``: print experiences stored in an SQL buffer (the FAQ's snippet as a command).

Reads only the queryable columns (no blobs, no torch), so it is quick on large databases.
"""

from __future__ import annotations

import click


def _short(text: str | None, width: int) -> str:
    if text is None:
        return ""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


@click.group(name="buffer")
def buffer_group() -> None:
    """Inspect experience buffers."""


@buffer_group.command(name="show")
@click.option("--path", required=True, help="SQLAlchemy URL of the buffer, e.g. sqlite:///buffer.db")
@click.option(
    "--name", "table", default=None, help="Buffer name (table); default: the only one in the database."
)
@click.option("--limit", default=10, show_default=True, type=click.IntRange(min=1), help="Rows to print.")
@click.option("--unread", is_flag=True, help="Only experiences no reader has consumed yet.")
@click.option("--width", default=60, show_default=True, type=int, help="Characters shown per text column.")
def buffer_show(path: str, table: str | None, limit: int, unread: bool, width: int) -> None:
    """Print prompt, response, reward and model version of stored experiences."""
    import sqlalchemy as sa

    from trinity.buffer.sql_schema import normalise_url, table_name_for

    url = normalise_url(path)
    if url.startswith("sqlite:///") and not _exists(url):
        raise click.ClickException(f"no database at {url}")
    engine = sa.create_engine(url)
    try:
        names = sa.inspect(engine).get_table_names()
        buffers = sorted(n for n in names if f"{n}_blobs" in names and f"{n}_writers" in names)
        if table is None:
            if len(buffers) != 1:
                found = ", ".join(buffers) or "none"
                raise click.ClickException(
                    f"{url} holds {len(buffers)} buffers ({found}); pick one with --name"
                )
            table = buffers[0]
        else:
            table = table_name_for(table)
            if table not in buffers:
                raise click.ClickException(
                    f"no buffer {table!r} in {url}; buffers: {', '.join(buffers) or 'none'}"
                )
        t = sa.Table(table, sa.MetaData(), autoload_with=engine)
        stmt = (
            sa.select(
                t.c.id,
                t.c.task_id,
                t.c.run_id,
                t.c.model_version,
                t.c.reward,
                t.c.consumed,
                # The trainer step that read the row (tables from before it was recorded lack it).
                (t.c.consumed_step if "consumed_step" in t.c else sa.null()).label("consumed_step"),
                t.c.prompt_text,
                t.c.response_text,
            )
            .order_by(t.c.id)
            .limit(limit)
        )
        if unread:
            stmt = stmt.where(t.c.consumed == 0)
        with engine.connect() as conn:
            rows = conn.execute(stmt).all()
            total = conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            left = conn.execute(
                sa.select(sa.func.count()).select_from(t).where(t.c.consumed == 0)
            ).scalar_one()
    finally:
        engine.dispose()

    from rich.console import Console
    from rich.table import Table

    out = Table(title=f"{table}: {total} experiences, {left} unread", show_lines=False)
    for col in ("id", "task", "run", "version", "reward", "read", "prompt", "response"):
        out.add_column(col, overflow="fold")
    for r in rows:
        reward = "" if r.reward is None else f"{r.reward:.4g}"
        out.add_row(
            str(r.id),
            str(r.task_id),
            str(r.run_id),
            str(r.model_version),
            reward,
            ("no" if not r.consumed else f"step {r.consumed_step}" if r.consumed_step is not None else "yes"),
            _short(r.prompt_text, width),
            _short(r.response_text, width),
        )
    Console(width=max(100, 2 * width + 60)).print(out)


def _exists(url: str) -> bool:
    import os

    return os.path.exists(url[len("sqlite:///") :].split("?")[0])
