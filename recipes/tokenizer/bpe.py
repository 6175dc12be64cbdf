"""Train a byte-level BPE tokenizer on local texts and save it as an HF tokenizer directory.

Nothing is downloaded. Training is a pure function of the multiset of texts and the vocabulary
size: the texts are sorted first, and the trainer's merge order breaks count ties by pair
ids, so the same inputs give the same ``tokenizer.json`` bytes in any process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nscas.errors import DestinationExists, InvalidInput

END_OF_TEXT = "<|endoftext|>"
"""Document separator and the padding token."""
TURN_START = "<|im_start|>"
"""Opens a chat turn, followed by the role name and a newline."""
TURN_END = "<|im_end|>"
"""Closes a chat turn; the eos token, so generation stops at the end of an answer."""
SPECIAL_TOKENS = (END_OF_TEXT, TURN_START, TURN_END)
"""Special tokens, in id order: they get ids 0, 1, 2."""

DEFAULT_VOCAB_SIZE = 2048
MIN_FREQUENCY = 2
"""A pair must occur at least this often to be merged (fixed, not a parameter)."""
MODEL_MAX_LENGTH = 8192
"""Advertised to transformers only; document lengths are checked by the tokenisation code."""
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256
"""The special tokens plus the 256 byte symbols every byte-level tokenizer needs."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ('system', 'user', 'assistant') %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "{% if message['content'] is not string %}"
    "{{ raise_exception('chat message content must be a string') }}"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML: each turn is ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``; the generation prompt is
``<|im_start|>assistant\\n``, so a prompt rendering is a prefix of the full rendering."""


def train_tokenizer(
    texts: Sequence[str], *, vocab_size: int = DEFAULT_VOCAB_SIZE, out_dir: Path
) -> Path:
    """Train on ``texts`` and save to ``out_dir`` (absent or empty); returns ``out_dir``.

    The directory loads with ``AutoTokenizer.from_pretrained`` and carries the chat template.
    The vocabulary may come out smaller than ``vocab_size`` when the texts allow few merges.
    """
    out_dir = Path(out_dir)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise InvalidInput(f"tokenizer vocab_size must be an integer, got {vocab_size!r}")
    if vocab_size < MIN_VOCAB_SIZE:
        raise InvalidInput(
            f"tokenizer vocab_size must be at least {MIN_VOCAB_SIZE} (256 bytes and "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}"
        )
    if isinstance(texts, str):
        raise InvalidInput("tokenizer training texts must be a list of strings, not one string")
    if not texts:
        raise InvalidInput("tokenizer training needs at least one text")
    bad = [i for i, text in enumerate(texts) if not isinstance(text, str)]
    if bad:
        raise InvalidInput(f"tokenizer training texts must be strings; item {bad[0]} is not")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DestinationExists(str(out_dir))
    # Imported here, as every recipe imports its heavy libraries inside ``run``: planning a
    # run loads this module for the recipe's params and would otherwise import transformers.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Sorting makes the result independent of the caller's order as well as of scheduling.
    backend.train_from_iterator(sorted(texts), trainer=trainer)

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=TURN_END,
        pad_token=END_OF_TEXT,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(out_dir)
    return out_dir
