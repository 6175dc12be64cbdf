"""``nscas serve-model``: serve a checkpoint over HTTP as one replica until SIGTERM.

Also runnable as ``python -m nscas.cli.serve_model ID ...``: the ``serve`` recipe starts its
replicas that way and reads the ready line from their stdout.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store
from nscas.errors import InvalidInput, NscasError

app = command_app()


@app.command(name="serve-model")
def serve_model(
    ctx: typer.Context,
    id_: IdArgument,
    host: Annotated[str, typer.Option(
        help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.")] = 0,
    store_path: Annotated[Path | None, typer.Option(
        "--store", show_default=False, file_okay=False,
        help="The store (default: the global --store, $NSCAS_STORE, or search upwards).")]
        = None,
    tasks: Annotated[str | None, typer.Option(
        show_default=False, help="A tasks/1 set (ID or ref) whose task ids /infer answers.")]
        = None,
    max_batch: Annotated[int, typer.Option(
        help="Most requests generated as one batch (1: no dynamic batching).")] = 8,
    max_wait_ms: Annotated[float, typer.Option(
        help="How long an open batch waits for its next request, in milliseconds.")] = 5.0,
    threads: Annotated[int, typer.Option(help="torch threads of this replica.")] = 1,
    max_new_tokens: Annotated[int, typer.Option(
        help="New tokens per /infer answer; the default max_tokens of chat completions.")] = 96,
    cache_size: Annotated[int, typer.Option(
        help="Answers the retry cache keeps, keyed by request id.")] = 1024,
    device: Annotated[str, typer.Option(
        help="cpu or cuda (the GPU is chosen with CUDA_VISIBLE_DEVICES).")] = "cpu",
    precision: Annotated[str, typer.Option(
        help="On CUDA: bf16 (autocast) or fp32 (no autocast or TF32: batching moves no "
             "token). CPU is FP32 either way.")] = "bf16",
    cuda_graphs: Annotated[bool, typer.Option(
        help="On CUDA with --precision fp32: capture each decoding step once per batch shape "
             "and replay it as a CUDA graph (one launch per token instead of one per "
             "kernel).")] = True,
    cpus: Annotated[str | None, typer.Option(
        show_default=False,
        help="Keep this replica on these CPUs (e.g. 2,3 or 4-7), so that replicas on one "
             "host do not share cores.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Load checkpoint ID, re-check its parameter digest, then serve it until SIGTERM.

    Prints one line once ready: 'listening http://HOST:PORT' (with --json, an object with
    'url' and 'model_digest'). Routes: GET /health, GET /stats, POST /infer with exactly
    {"request_id", "task_id"}, POST /v1/chat/completions (OpenAI-compatible, greedy; the
    Idempotency-Key header is the request id). SIGTERM: accepted requests finish, new ones
    get 503, then exit 0.

    Example: nscas serve-model experiments/coop/clean-pair --tasks experiments/coop/dev
    """
    from nscas.recipes.serve.replica import pin_to_cpus

    _check(max_batch=max_batch, max_wait_ms=max_wait_ms, threads=threads,
           max_new_tokens=max_new_tokens, cache_size=cache_size, device=device, port=port,
           precision=precision)
    if cpus is not None:  # first, so that every thread started from here on inherits it
        pin_to_cpus(cpus)

    from nscas.reading import open_store
    from nscas.recipes.serve.replica import load_replica
    from nscas.recipes.serve.server import ServerConfig, serve
    config = ServerConfig(host=host, port=port, max_batch=max_batch, max_wait_ms=max_wait_ms,
                          max_new_tokens=max_new_tokens, cache_size=cache_size)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    store = (open_store(store_path, readonly=True) if store_path is not None
             else open_cli_store(ctx, readonly=True))
    with store, tempfile.TemporaryDirectory(prefix="nscas-serve-") as workdir:
        checkpoint = store.resolve(id_)
        task_set = store.resolve(tasks) if tasks is not None else None
        replica = load_replica(store, checkpoint, task_set, device=device,
                               workdir=Path(workdir), threads=threads, precision=precision,
                               cuda_graphs=cuda_graphs)

        def ready(url: str) -> None:
            if as_json:
                render.json_out({"url": url, "model_digest": replica.model_digest})
            else:
                render.text(f"listening {url}")
            sys.stdout.flush()  # whoever started us waits for this line

        asyncio.run(serve(replica, config, on_ready=ready))


def _check(*, max_batch: int, max_wait_ms: float, threads: int, max_new_tokens: int,
           cache_size: int, device: str, port: int, precision: str) -> None:
    for name, value in (("--max-batch", max_batch), ("--threads", threads),
                        ("--max-new-tokens", max_new_tokens), ("--cache-size", cache_size)):
        if value < 1:
            raise InvalidInput(f"{name} must be at least 1, got {value}")
    if max_wait_ms < 0:
        raise InvalidInput(f"--max-wait-ms must not be negative, got {max_wait_ms}")
    if device not in ("cpu", "cuda"):
        raise InvalidInput(f"--device must be cpu or cuda, got {device!r}")
    if precision not in ("bf16", "fp32"):
        raise InvalidInput(f"--precision must be bf16 or fp32, got {precision!r}")
    if not 0 <= port <= 65535:
        raise InvalidInput(f"--port must be from 0 to 65535, got {port}")


def main() -> None:
    """``python -m nscas.cli.serve_model``: the command alone, with the CLI's error mapping."""
    try:
        app(prog_name="nscas serve-model")
    except NscasError as exc:
        render.error(exc.message)
        raise SystemExit(exc.exit_code) from None
    except OSError as exc:  # a port in use, an unreadable store
        render.error(f"{exc.strerror or exc}")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
