"""``nscas serve-model``: serve a checkpoint over HTTP as one replica until SIGTERM.

A thin command over ``nscas.recipes.serve.replica_main``, the process the ``serve`` recipe
starts; this adds the CLI's store lookup and help. Also runnable as
``python -m nscas.cli.serve_model ID ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store
from nscas.errors import NscasError

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
    name: Annotated[str | None, typer.Option(
        show_default=False,
        help="The model's name in OpenAI answers ('model') and GET /v1/models (default: ID "
             "as given).")] = None,
    max_batch: Annotated[int, typer.Option(
        help="Most requests generated as one batch (1: no dynamic batching).")] = 8,
    max_wait_ms: Annotated[float, typer.Option(
        help="How long an open batch waits for its next request, in milliseconds.")] = 5.0,
    threads: Annotated[int, typer.Option(
        help="torch threads of each instance's generation thread.")] = 1,
    instances: Annotated[int, typer.Option(
        help="Model instances in this process (1 to 8), each a copy of the model with its own "
             "generation thread and, on CUDA, its own stream, so that one GPU runs their "
             "kernels side by side; a request goes to the instance with the fewest in "
             "flight. On the CPU, instances x threads may not exceed the CPUs allowed.")] = 1,
    max_new_tokens: Annotated[int, typer.Option(
        help="New tokens per /infer answer; the default max_tokens of completions.")] = 96,
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
    header_timeout: Annotated[float, typer.Option(
        help="Seconds a connection may take to send a request's line and headers, from its "
             "opening or its last answer; then it is closed.")] = 10.0,
    body_timeout: Annotated[float, typer.Option(
        help="Seconds a request body may take to arrive; then 408 and the connection "
             "closes.")] = 30.0,
    max_connections: Annotated[int, typer.Option(
        help="Open connections at most; one more gets 503 (with Retry-After) and is "
             "closed.")] = 256,
    as_json: JsonFlag = False,
) -> None:
    """Load checkpoint ID, re-check its parameter digest, then serve it until SIGTERM.

    Prints one line once ready: 'listening http://HOST:PORT' (with --json, an object with
    'url' and 'model_digest'). Routes: GET /health, GET /stats, POST /infer with exactly
    {"request_id", "task_id"} (greedy, what the serve recipe measures), and OpenAI-compatible
    GET /v1/models, POST /v1/chat/completions and POST /v1/completions (a prompt string, no
    chat template). These decode greedily unless temperature >= 0.01 (up to 2; top_p in (0, 1];
    a 64-bit integer seed gives the same text again), honour max_tokens and stop (up to 4
    strings; the text ends before the first), and stream each token as it is generated
    (stream: true; stream_options.include_usage). Answers name the model by --name, carry
    the checkpoint ID in system_fingerprint, and the parameter digest and output token ids in
    'nscas'. Refusals are OpenAI error objects {"error": {"message", "type", "param",
    "code"}}. The Idempotency-Key header is the request id of a completion: a retry gets the
    first answer. SIGTERM: accepted requests finish, new ones get 503, then exit 0.

    Example: nscas serve-model experiments/coop/clean-pair --tasks experiments/coop/dev
    --name coop (then: OpenAI(base_url="http://127.0.0.1:PORT/v1", api_key="-"))
    """
    from nscas.recipes.serve.replica_main import ReplicaSettings, ready_line, run_replica

    settings = ReplicaSettings(
        checkpoint=id_, tasks=tasks, name=name, host=host, port=port, max_batch=max_batch,
        max_wait_ms=max_wait_ms, threads=threads, instances=instances,
        max_new_tokens=max_new_tokens,
        cache_size=cache_size, device=device, precision=precision, cuda_graphs=cuda_graphs,
        cpus=cpus, header_timeout=header_timeout, body_timeout=body_timeout,
        max_connections=max_connections)

    def open_store() -> Any:
        if store_path is None:
            return open_cli_store(ctx, readonly=True)
        from nscas.store.opening import open_store

        return open_store(store_path, readonly=True)

    def ready(url: str, model_digest: str) -> None:
        render.text(ready_line(url, model_digest, as_json=as_json))
        sys.stdout.flush()  # whoever started us waits for this line

    run_replica(settings, open_store, on_ready=ready)


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
