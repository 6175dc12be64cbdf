"""A checkpoint loaded as a reader loads it, for replay, and chat turns encoded as its training
saw them (docs/format.md §7.8, docs/experiment.md §3.1). The model comes from the checkpoint's
own files through transformers and torch; nothing here imports nscas (docs/format.md §7.1).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from ..bundle.loading import model_folder
from ..records.closure import Objects, Unusable

IGNORE = -100


def _messages(line: Mapping[str, Any]) -> list[dict[str, str]]:
    """A probe's chat messages: its ``messages``, or a grounded ``prompt`` and ``target``."""
    if "messages" in line:
        messages = line["messages"]
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages):
            raise ValueError("messages are not {role, content} strings")
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if isinstance(line.get("prompt"), str) and isinstance(line.get("target"), str):
        return [{"role": "user", "content": line["prompt"]},
                {"role": "assistant", "content": line["target"]}]
    raise ValueError("has neither messages nor a prompt and target")


def encode_turns(line: Mapping[str, Any], render: Callable[[list[dict[str, str]], bool], str],
            tokenizer: Any, turn: int) -> tuple[list[int], list[int]]:
    """Token ids and labels: each answer from its first token through the end of its turn."""
    messages = _messages(line)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    ids = encode(render(messages, False))
    labels = [IGNORE] * len(ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(encode(render(messages[:index], True)))
        if turn not in ids[start:]:
            raise ValueError(f"assistant message {index} has no end-of-turn token after it")
        end = ids.index(turn, start)
        labels[start:end + 1] = ids[start:end + 1]
    return ids, labels


@contextmanager
def loaded_model(objects: Objects, checkpoint: str, device: str) -> Iterator[Any]:
    """The checkpoint's model in FP32 on ``device``, loaded from its own files."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="nscas-replay-") as tmp, ExitStack() as files:
        root = checkpoint_dir(objects, checkpoint, Path(tmp), files)
        try:
            with _quiet():
                model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32)
        except Exception as exc:  # transformers raises many kinds for a directory it cannot load
            raise Unusable(checkpoint, f"does not load as a model ({type(exc).__name__}: "
                           f"{exc})") from None
        # transformers' decorated PreTrainedModel.to is typed as taking the model, not a device.
        model.to(device).eval()  # type: ignore[arg-type]
        yield model


def checkpoint_dir(objects: Objects, checkpoint: str, root: Path, files: ExitStack) -> Path:
    """The folder a reader loads ``checkpoint`` from: in a bundle, its own model folder, once
    it holds exactly the checkpoint's files (``loading.model_folder``); elsewhere ``root``
    made a directory of the checkpoint's files, links to verified copies kept open in
    ``files`` (close it only after the model is loaded). Unsafe paths are refused."""
    folder = model_folder(objects, checkpoint)
    if folder is not None:
        return folder
    tree = objects.record_of(objects.record_of(checkpoint, "checkpoint/1")["files"], "tree/1")
    for rel, entry in sorted(tree["entries"].items()):
        path = PurePosixPath(rel)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise Unusable(checkpoint, f"names an unsafe file path {rel!r}")
        target = root.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        source = files.enter_context(objects.as_file(entry["id"], name=path.name))
        os.symlink(Path(source).resolve(), target)
    return root


@contextmanager
def _quiet() -> Iterator[None]:
    """No transformers progress bar on the auditor's terminal while a model loads."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated
