"""``trinity studio``: the browser front end (config builder, runs, experiences)."""

from __future__ import annotations

import click


@click.command(name="studio")
@click.option(
    "--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="Port to serve on."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but loopback requires the access token printed at start-up.",
)
@click.option(
    "--root",
    default=None,
    type=click.Path(file_okay=False),
    help="Checkpoint root whose runs are shown [default: $TRINITY_CHECKPOINT_ROOT_DIR or ./checkpoints].",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the studio in a web browser.")
def studio(port: int, host: str, root: str | None, open_browser: bool) -> None:
    """Configure, launch and inspect runs in the browser."""
    from trinity_studio import launch

    launch(host=host, port=port, root=root, open_browser=open_browser)
