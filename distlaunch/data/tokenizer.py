"""Tokenizers for ``distlaunch data prepare``: a byte-level BPE trained on the user's corpus, a given
``tokenizer.json``, or tiktoken's gpt2 read from a local rank file. Nothing is ever downloaded.

``--tokenizer`` takes ``bpe:VOCAB``, ``PATH/tokenizer.json``, ``PATH.tiktoken`` (a tiktoken rank
file: base64 token and rank per line) or ``gpt2``. gpt2 is tiktoken's ``r50k_base`` ranks (GPT-2's
50,257-token vocabulary); its file is looked up where tiktoken caches it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from distlaunch.data.index import TokenizerInfo
from distlaunch.errors import UsageError
from distlaunch.extras import install_command

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
ENDOFTEXT = "<|endoftext|>"
MIN_BPE_VOCAB = 257  # the 256 byte tokens plus <|endoftext|>
MAX_VOCAB = 1 << 24
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def _require(module: str):
    """Import an optional dependency of data prepare, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            f"{module} is not installed (distlaunch data prepare needs it for this --tokenizer)",
            install_command("data"),
        ) from None


class Tokenizer:
    """The operations prepare needs, over an HF ``tokenizers.Tokenizer`` or a ``tiktoken.Encoding``.

    ``splits_at_spaces``: whether a text cut before a single space between two non-space characters
    encodes to the same ids as the whole (prepare then encodes a long document in pieces). True for
    GPT-2's pre-tokenizer pattern and for whitespace pre-tokenizers without a normalizer: their
    tokens never span such a space, and a space followed by a non-space always starts a token.
    """

    def __init__(self, backend, info: TokenizerInfo, source_file: Path | None = None, splits_at_spaces: bool = False):
        self.backend, self.info, self.source_file = backend, info, source_file
        self.splits_at_spaces = splits_at_spaces

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def eos_id(self) -> int | None:
        return self.info.eos_id

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens (prepare appends ``eos_id``)."""
        if self.info.kind == "tiktoken":
            return self.backend.encode_ordinary_batch(texts)
        return [enc.ids for enc in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Ids back to text."""
        return self.backend.decode(ids)

    def save(self, folder: Path) -> TokenizerInfo:
        """Write the tokenizer into ``folder``; returns the index entry naming its file."""
        if self.info.kind == "tiktoken":
            shutil.copyfile(self.source_file, folder / self.info.file)
        else:
            self.backend.save(str(folder / self.info.file))
        return self.info


def parse_spec(spec: str) -> tuple[str, str]:
    """``--tokenizer`` as (kind, argument): ("bpe", "VOCAB"), ("tokenizer.json", PATH), ("tiktoken", PATH|gpt2)."""
    if spec.startswith("bpe:"):
        return "bpe", spec[4:]
    if spec == "gpt2":
        return "tiktoken", "gpt2"
    if spec.endswith(".tiktoken"):
        return "tiktoken", spec
    if spec.endswith(".json"):
        return "tokenizer.json", spec
    folder = Path(spec).expanduser()
    if spec and folder.is_dir():
        inside = [folder / name for name in ("tokenizer.json", "tokenizer.tiktoken") if (folder / name).is_file()]
        raise UsageError(
            f"--tokenizer {spec} is a folder",
            f"pass the file: --tokenizer {inside[0]}" if inside else "pass PATH/tokenizer.json or PATH.tiktoken",
        )
    raise UsageError(
        f"unknown --tokenizer {spec!r}",
        "use bpe:VOCAB (train on the corpus), PATH/tokenizer.json, PATH.tiktoken or gpt2",
    )


def bpe_vocab(text: str) -> int:
    """The VOCAB of ``bpe:VOCAB``, checked."""
    try:
        vocab = int(text)
    except ValueError:
        vocab = -1
    if not MIN_BPE_VOCAB <= vocab <= MAX_VOCAB:
        raise UsageError(
            f"bad --tokenizer bpe:{text}: the vocabulary size must be an integer from {MIN_BPE_VOCAB} to {MAX_VOCAB}",
            "for example bpe:8192 (256 byte tokens + <|endoftext|> + merges)",
        )
    return vocab


def train_bpe(vocab: int, texts: Iterable[str]) -> Tokenizer:
    """A byte-level BPE (GPT-2 style) trained on ``texts``; ``<|endoftext|>`` is id 0."""
    hf_tokenizers = _require("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = hf_tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[ENDOFTEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    info = TokenizerInfo(
        kind="bpe",
        name=f"bpe:{vocab}",
        file="tokenizer.json",
        vocab_size=hf.get_vocab_size(with_added_tokens=True),
        eos_id=hf.token_to_id(ENDOFTEXT),
    )
    return Tokenizer(hf, info, splits_at_spaces=True)  # ByteLevel with GPT-2's pattern, no normalizer


def _splits_at_spaces(config: dict) -> bool:
    """Whether an HF tokenizer's config encodes a text cut at a space as it encodes the whole (see
    ``Tokenizer``): no normalizer, a GPT-2-pattern or whitespace pre-tokenizer, and no added token
    that holds whitespace or swallows the whitespace after it."""
    pre = config.get("pre_tokenizer") or {}
    safe_pre = (pre.get("type") == "ByteLevel" and pre.get("use_regex", True)) or pre.get("type") in (
        "Whitespace",
        "WhitespaceSplit",
    )
    added = config.get("added_tokens") or []
    safe_added = all(not a.get("rstrip") and not any(c.isspace() for c in a.get("content", "")) for a in added)
    return config.get("normalizer") is None and safe_pre and safe_added


def load_tokenizer_json(path: str | Path, name: str | None = None, require_eos: bool = True) -> Tokenizer:
    """An HF ``tokenizer.json``; its end-of-text token is the first of EOS_CANDIDATES it has."""
    source = Path(path).expanduser()
    if not source.is_file():
        raise UsageError(f"tokenizer file not found: {source}", "pass an existing tokenizer.json")
    hf_tokenizers = _require("tokenizers")
    try:
        hf = hf_tokenizers.Tokenizer.from_file(str(source))
    except Exception as err:  # tokenizers raises its own Exception type for a bad file
        raise UsageError(f"{source} is not a tokenizer.json: {err}", "pass a file saved by HF tokenizers") from None
    config = json.loads(hf.to_str())
    model = config.get("model") or {}
    unk = model.get("unk_token")
    if unk is not None and isinstance(model.get("vocab"), dict) and unk not in model["vocab"]:
        # tokenizers fails only when it meets an unknown word, mid-run: refuse it up front
        raise UsageError(
            f"{source}: its {model.get('type')} model's unknown-word token {unk!r} is not in its vocabulary",
            f"add {unk!r} to the model's vocab (unknown words are encoded as it)",
        )
    eos = next((hf.token_to_id(t) for t in EOS_CANDIDATES if hf.token_to_id(t) is not None), None)
    if eos is None and require_eos:
        raise UsageError(
            f"{source} has no end-of-text token (none of {', '.join(EOS_CANDIDATES)})",
            f"prepare ends every document with one: add it, e.g. tok.add_special_tokens([{ENDOFTEXT!r}]); "
            "tok.save(PATH) with HF tokenizers",
        )
    info = TokenizerInfo(
        kind="tokenizer.json",
        name=name or str(source),
        file="tokenizer.json",
        # the largest id + 1, not the number of entries: a vocabulary may skip ids
        vocab_size=max(hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1,
        eos_id=eos,
    )
    return Tokenizer(hf, info, splits_at_spaces=_splits_at_spaces(config))


def tiktoken_cache_dir() -> Path:
    """Where tiktoken keeps its files: TIKTOKEN_CACHE_DIR, DATA_GYM_CACHE_DIR, else $TMPDIR/data-gym-cache."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def find_gpt2_file() -> Path:
    """gpt2's rank file (tiktoken's r50k_base) from tiktoken's cache, checked against its sha256."""
    cache = tiktoken_cache_dir()
    names = (hashlib.sha1(R50K_URL.encode()).hexdigest(), "r50k_base.tiktoken", "gpt2.tiktoken")
    found = next((cache / n for n in names if (cache / n).is_file()), None)
    if found is None:
        raise UsageError(
            f"tiktoken's gpt2 BPE file is not in {cache} (distlaunch never downloads it)",
            f"download {R50K_URL} on a connected machine and save it as {cache / 'r50k_base.tiktoken'}, "
            "or set TIKTOKEN_CACHE_DIR to a folder that holds it",
        )
    digest = hashlib.sha256(found.read_bytes()).hexdigest()
    if digest != R50K_SHA256:
        raise UsageError(
            f"{found} is not tiktoken's r50k_base.tiktoken (sha256 {digest[:12]}..., expected {R50K_SHA256[:12]}...)",
            f"replace it with a fresh copy of {R50K_URL}",
        )
    return found


def read_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken rank file: one ``base64(token) rank`` per line, checked so tiktoken cannot panic on it:
    ranks are distinct, non-negative and below MAX_VOCAB, no token repeats, and every byte is a token."""
    ranks: dict[bytes, int] = {}
    lines: dict[int, int] = {}  # rank -> its line
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}", "pass a readable .tiktoken rank file") from None
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token_b64, rank_text = line.split()
            token, rank = base64.b64decode(token_b64, validate=True), int(rank_text)
        except ValueError:
            raise UsageError(
                f"{path}:{number}: not a tiktoken rank line: {line[:60]!r}", "each line is: base64-token rank"
            ) from None
        repeat = ("token", lines[ranks[token]]) if token in ranks else ("rank", lines[rank]) if rank in lines else None
        if repeat:
            raise UsageError(
                f"{path}:{number}: {repeat[0]} repeats line {repeat[1]}: {line[:60].decode(errors='replace')!r}",
                "each token, and each rank, appears once in a tiktoken rank file",
            )
        if not 0 <= rank < MAX_VOCAB - 1:  # the end-of-text token takes the rank after the last
            raise UsageError(f"{path}:{number}: rank {rank} is not from 0 to {MAX_VOCAB - 2}", "ranks are token ids")
        ranks[token], lines[rank] = rank, number
    if not ranks:
        raise UsageError(f"{path} holds no tokens", "pass a tiktoken rank file (base64-token rank per line)")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        shown = ", ".join(f"0x{b:02x}" for b in missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise UsageError(
            f"{path} lacks {len(missing)} of the 256 single-byte tokens ({shown})",
            "a tiktoken rank file is a byte-level BPE: every byte 0-255 must be a token of its own",
        )
    return ranks


def load_tiktoken(arg: str) -> Tokenizer:
    """gpt2 (from tiktoken's cache) or a ``.tiktoken`` rank file, with GPT-2's pattern and ``<|endoftext|>``."""
    tiktoken = _require("tiktoken")
    path = find_gpt2_file() if arg == "gpt2" else Path(arg).expanduser()
    if not path.is_file():
        raise UsageError(f"tokenizer file not found: {path}", "pass an existing .tiktoken rank file")
    ranks = read_ranks(path)
    eos = max(ranks.values()) + 1
    specials = {ENDOFTEXT: eos}
    enc = tiktoken.Encoding(
        name=arg if arg == "gpt2" else path.stem, pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )
    info = TokenizerInfo(
        kind="tiktoken",
        name=arg if arg == "gpt2" else str(path),
        file="tokenizer.tiktoken",
        vocab_size=eos + 1,
        eos_id=eos,
        pat_str=GPT2_PATTERN,
        special_tokens=specials,
    )
    return Tokenizer(enc, info, source_file=path, splits_at_spaces=True)  # always GPT-2's pattern


def make_tokenizer(spec: str, texts: Iterator[str] | None = None) -> Tokenizer:
    """The tokenizer ``--tokenizer`` names; ``texts`` is the corpus a ``bpe:VOCAB`` is trained on."""
    kind, arg = parse_spec(spec)
    if kind == "bpe":
        return train_bpe(bpe_vocab(arg), texts or iter(()))
    if kind == "tokenizer.json":
        return load_tokenizer_json(arg)
    return load_tiktoken(arg)


def load_saved_tokenizer(folder: str | Path, info: TokenizerInfo) -> Tokenizer:
    """The tokenizer stored in a prepared folder (to decode its tokens)."""
    path = Path(folder).expanduser() / info.file
    if info.kind == "tiktoken":
        enc = _require("tiktoken").Encoding(
            name="saved",
            pat_str=info.pat_str or GPT2_PATTERN,
            mergeable_ranks=read_ranks(path),
            special_tokens=info.special_tokens,
        )
        return Tokenizer(enc, info, source_file=path)
    loaded = load_tokenizer_json(path, name=info.name, require_eos=False)
    return Tokenizer(loaded.backend, info)
