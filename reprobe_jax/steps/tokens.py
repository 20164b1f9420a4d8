"""The bytes tokens add to the decoded text (docs/method.md §A1): the byte model of a tokenizer's vocabulary
(`token_bytes`), exact O(n) token end offsets, checked token ids, and the one per-tokenizer cache of the tables that
`reprobe_jax.steps` compiles from a vocabulary (`compiled`).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import re
import weakref
from typing import Callable, Hashable, Sequence, TypeVar

import numpy as np

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.io.readers import shown

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, eq=False)
class TokenBytes:
  """The bytes each token id adds to the decoded text, and how the tokenizer's decoder joins them.

  `byte_level` (GPT-2, Llama 3, Qwen, SmolLM2): every token is bytes and the text is their UTF-8 decoding, one U+FFFD
  per maximal invalid subsequence. `pieces` (SentencePiece with byte fallback: Llama 2, Mistral, Gemma): a token is
  text ('▁' read as a space) or, if `is_byte`, one byte `<0xXX>`; a run of byte tokens decodes as UTF-8 if it is
  valid and as one U+FFFD per byte if not, and `strip` leading `strip_char`s of the whole text are dropped.
  """

  kind: str
  pieces: tuple[bytes, ...]  # [V]
  is_byte: tuple[bool, ...]  # [V]
  strip: int = 0
  strip_char: str = " "

  def piece(self, t: int) -> tuple[bytes, bool]:
    """(bytes, is_byte) of id t; an id outside the vocabulary adds nothing, as the tokenizer's decode skips it."""
    return (self.pieces[t], self.is_byte[t]) if 0 <= t < len(self.pieces) else (b"", False)


_TOKEN_BYTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BYTE_TOKEN = re.compile(r"<0x(\+[0-9A-Fa-f]|[0-9A-Fa-f]{2})>")


def _gpt2_byte_chars() -> dict[str, int]:
  """The printable character byte-level BPE vocabularies spell each byte with (GPT-2's table) -> that byte."""
  keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
  out, extra = {chr(b): b for b in keep}, 0
  for b in range(256):
    if b not in keep:
      out[chr(256 + extra)] = b
      extra += 1
  return out


def _decoder_steps(tokenizer) -> list[dict]:
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None:
    raise ConfigError(f"{type(tokenizer).__name__}: step alignment needs a fast (Rust) tokenizer")
  if getattr(tokenizer, "clean_up_tokenization_spaces", False):
    raise ConfigError(
      f"{type(tokenizer).__name__}: clean_up_tokenization_spaces=True rewrites the decoded text, so "
      "tokens no longer add fixed bytes to it; load the tokenizer with it set to False"
    )
  if backend.decoder is None:
    return []
  spec = json.loads(backend.decoder.__getstate__())
  return spec["decoders"] if spec["type"] == "Sequence" else [spec]


def _build_token_bytes(tokenizer) -> TokenBytes:
  steps = _decoder_steps(tokenizer)
  names = [n or "" for n in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]
  kinds = [s["type"] for s in steps]
  if kinds == ["ByteLevel"]:
    table = _gpt2_byte_chars()
    pieces = tuple(bytes(table[c] for c in n) if all(c in table for c in n) else n.encode() for n in names)
    return TokenBytes("byte_level", pieces, (False,) * len(pieces))
  if not steps:  # no decoder: the tokens joined by single spaces
    return TokenBytes("pieces", tuple((" " + n).encode() for n in names), (False,) * len(names), strip=1)
  k = 0
  while k < len(steps) and kinds[k] == "Replace" and "String" in steps[k]["pattern"]:
    names = [n.replace(steps[k]["pattern"]["String"], steps[k]["content"]) for n in names]
    k += 1
  fallback = kinds[k : k + 1] == ["ByteFallback"]
  k += fallback
  strip = strip_char = None
  if kinds[k : k + 1] == ["Fuse"]:  # tokens are joined anyway; Fuse only makes a later Strip act on the whole text
    k += 1
    if kinds[k : k + 1] == ["Strip"] and steps[k]["stop"] == 0 and len(steps[k]["content"]) == 1:
      strip, strip_char, k = steps[k]["start"], steps[k]["content"], k + 1
  if k != len(steps):
    raise ConfigError(
      f"{type(tokenizer).__name__}: decoder {kinds} is not one step alignment models (ByteLevel, or "
      "Replace.. + ByteFallback + Fuse + Strip as SentencePiece conversions have)"
    )
  is_byte = tuple(bool(fallback and _BYTE_TOKEN.fullmatch(n)) for n in names)
  pieces = tuple(bytes([int(n[3:5], 16)]) if b else n.encode() for n, b in zip(names, is_byte))
  return TokenBytes("pieces", pieces, is_byte, strip or 0, strip_char or " ")


def token_bytes(tokenizer) -> TokenBytes:
  """The byte model of `tokenizer`'s vocabulary (built once per tokenizer, then cached), checked against its own
  decoding of a sample of single tokens."""
  if tokenizer is None:
    raise ConfigError(
      "step boundaries, alignment and answer lines are built from a tokenizer's vocabulary; got no "
      "tokenizer (a model loaded without one has none)"
    )
  if tokenizer in _TOKEN_BYTES and len(_TOKEN_BYTES[tokenizer].pieces) == len(tokenizer):  # no tokens added since
    return _TOKEN_BYTES[tokenizer]
  tb = _build_token_bytes(tokenizer)
  n = len(tb.pieces)
  sample = sorted(set(range(0, n, max(1, n // 512))) | set(getattr(tokenizer, "added_tokens_decoder", {})))
  sample = [i for i in sample if i < n]
  for i, got in zip(sample, tokenizer.batch_decode([[i] for i in sample])):
    want = _decode(tb, [i])[0]
    if got != want:
      raise ConfigError(
        f"{type(tokenizer).__name__}: token {i} decodes to {got!r}, but its byte model gives "
        f"{want!r}; this decoder is not one step alignment supports"
      )
  _TOKEN_BYTES[tokenizer] = tb
  return tb


# ------------------------------------------------------------------------------------------------ exact offsets
# For each prefix ids[:k+1], the old definition decoded the prefix and took its longest common prefix with the whole
# text. Decoders are local, so a prefix's text is the whole text's first c characters plus a short tail that differs
# (a U+FFFD for a character still incomplete, or a byte run read differently); c follows from one pass.


def _byte_level_ends(segs: list[bytes]) -> tuple[str, list[int]]:
  """Byte-level BPE: the text is the UTF-8 reading of all the bytes; a prefix's, of its bytes."""
  dec = codecs.getincrementaldecoder("utf-8")("replace")
  parts, marks, n = [], [], 0
  for data in segs:
    parts.append(dec.decode(data))
    n += len(parts[-1])
    marks.append((n, dec.getstate()[0]))
  text = "".join(parts) + dec.decode(b"", final=True)
  ends, prev = [], 0
  for c, pending in marks:  # bytes of a character not yet complete: the prefix reads them as U+FFFD
    tail = pending.decode("utf-8", "replace")
    prev = max(prev, c + _common(tail, text, c))
    ends.append(prev)
  return text, ends


def _common(a: str, b: str, at: int) -> int:
  """Length of the common prefix of `a` and b[at:]."""
  n = 0
  while n < len(a) and at + n < len(b) and a[n] == b[at + n]:
    n += 1
  return n


def _run_prefixes(run: bytes) -> list[tuple[bool, str]]:
  """For each prefix run[:m] (m = 1..len): whether it is complete, valid UTF-8, and its text if so."""
  dec = codecs.getincrementaldecoder("utf-8")("strict")
  out, chars, ok = [], [], True
  for b in run:
    if ok:
      try:
        chars.append(dec.decode(bytes([b])))
      except UnicodeDecodeError:
        ok = False
    out.append((ok and not dec.getstate()[0], "".join(chars) if ok and not dec.getstate()[0] else ""))
  return out


def _pieces_ends(tb: TokenBytes, segs: list[tuple[bytes, bool]]) -> tuple[str, list[int]]:
  """SentencePiece-style: text pieces as they are, byte runs as UTF-8 or one U+FFFD per byte, then the strip."""
  parts, spans, n, i = [], [], 0, 0  # spans: per piece (chars before its byte run, the run or None, bytes into it)
  while i < len(segs):
    if not segs[i][1]:
      parts.append(segs[i][0].decode())
      n += len(parts[-1])
      spans.append((n, None, 0))
      i += 1
      continue
    j = i
    while j < len(segs) and segs[j][1]:
      j += 1
    run = b"".join(s for s, _ in segs[i:j])
    valid = _valid(run)
    whole = run.decode() if valid else "\ufffd" * len(run)
    info = (run, whole, valid, _run_prefixes(run))
    spans += [(n, info, m) for m in range(1, j - i + 1)]
    parts.append(whole)
    n += len(whole)
    i = j
  raw = "".join(parts)
  fffd = [0] * (len(raw) + 1)  # length of the U+FFFD run starting at each character
  for k in range(len(raw) - 1, -1, -1):
    fffd[k] = fffd[k + 1] + 1 if raw[k] == "\ufffd" else 0
  lead = 0
  while lead < min(tb.strip, len(raw)) and raw[lead] == tb.strip_char:
    lead += 1
  ends, prev = [], 0
  for base, info, m in spans:
    c, tail = base, ""
    if info is not None:
      run, whole, valid, prefixes = info
      ok, x = prefixes[m - 1]
      if m == len(run) or (valid and ok):  # a prefix of the run's own text
        c = base + (len(whole) if m == len(run) else len(x))
      elif valid:  # the prefix reads as m U+FFFD, the whole run as text
        c = base + min(m, fffd[base])
        tail = "\ufffd" * (base + m - c)
      elif ok:  # the prefix reads as text, the whole run as one U+FFFD per byte
        c = base + len(x) - len(x.lstrip("\ufffd"))
        tail = x[c - base :]
      else:
        c = base + m
    if c > lead or (lead == tb.strip and c >= lead):
      e = c - lead
    else:  # the prefix may strip other leading characters than the whole text does: compare the texts
      pre = raw[:c] + tail
      s = 0
      while s < min(tb.strip, len(pre)) and pre[s] == tb.strip_char:
        s += 1
      e = _common(pre[s:], raw, lead)
    prev = max(prev, e)
    ends.append(prev)
  return raw[lead:], ends


def _valid(data: bytes) -> bool:
  try:
    data.decode()
  except UnicodeDecodeError:
    return False
  return True


def _pieces(tb: TokenBytes, ids: Sequence[int], cuts: Sequence[int]) -> tuple[list[tuple[bytes, bool]], list[int]]:
  """The tokens' (bytes, is_byte), split at the sorted byte offsets `cuts`, and the byte offset each piece ends at."""
  segs, at, pos, ci = [], [], 0, 0
  for t in ids:
    data, is_byte = tb.piece(t)
    lo = 0
    while ci < len(cuts) and cuts[ci] < pos + len(data):
      if cuts[ci] > pos + lo:
        segs.append((data[lo : cuts[ci] - pos], is_byte))
        at.append(cuts[ci])
        lo = cuts[ci] - pos
      ci += 1
    pos += len(data)
    segs.append((data[lo:], is_byte))
    at.append(pos)
  return segs, at


def _decode(tb: TokenBytes, ids: Sequence[int], cuts: Sequence[int] = ()) -> tuple[str, list[int], list[int]]:
  """(text, ends, byte ends) of `ids`, split at `cuts`: the decoded text, and per piece the character offset where it
  ends by the prefix-decoding definition and the byte offset where it ends. O(n)."""
  segs, at = _pieces(tb, ids, cuts)
  if tb.kind == "byte_level":
    return (*_byte_level_ends([s for s, _ in segs]), at)
  return (*_pieces_ends(tb, segs), at)


def char_offsets(tb: TokenBytes, ids: Sequence[int], positions: Sequence[int]) -> tuple[str, list[int]]:
  """(text, character offsets of the byte `positions`); a position on a character boundary gets its exact offset."""
  text, ends, at = _decode(tb, ids, sorted(set(positions)))
  char_at = {0: 0, **dict(zip(at, ends))}
  return text, [char_at[p] for p in positions]


def token_end_offsets(tokenizer, ids: Sequence[int]) -> tuple[str, list[int]]:
  """The decoded text and, for each token, the character offset where it ends in that text.

  Equal to decoding every prefix and taking its common prefix with the whole text (a token that completes a
  multi-byte character ends where the character does), but computed in one pass from `token_bytes`."""
  ids = token_ids(ids)
  text, ends, _ = _decode(token_bytes(tokenizer), ids)
  check_text(tokenizer, ids, text)
  return text, ends


def check_text(tokenizer, ids: Sequence[int], text: str) -> None:
  """ConfigError unless `tokenizer` decodes `ids` to `text` (what its byte model gave): one decode, O(n)."""
  full = tokenizer.decode(ids)
  if text != full:
    k = next((i for i, (a, b) in enumerate(zip(text, full)) if a != b), min(len(text), len(full)))
    raise ConfigError(
      f"{type(tokenizer).__name__} decodes these ids to {full[max(0, k - 20) : k + 20]!r} at char {k}, "
      f"but its byte model gives {text[max(0, k - 20) : k + 20]!r}"
    )


def byte_ends(tb: TokenBytes, ids: Sequence[int]) -> list[int]:
  """[n] the byte offset where each token ends in the concatenated token bytes."""
  out, pos = [], 0
  for t in ids:
    pos += len(tb.piece(t)[0])
    out.append(pos)
  return out


MAX_TOKEN_ID = 2**32 - 1  # what a tokenizer's decode takes (u32); ids above the vocabulary add no bytes


def token_ids(ids) -> list[int]:
  """`ids` as a list of ints; DataFormatError unless it is a sequence (not a string, not a number) of integers in
  [0, 2**32) (bools and floats are no token ids)."""
  if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray)):
    raise DataFormatError(f"token ids must be a sequence of integers, found {shown(ids)}")
  out = []
  for k, t in enumerate(ids):
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) or not 0 <= t <= MAX_TOKEN_ID:
      raise DataFormatError(f"token ids[{k}] must be an integer in [0, {MAX_TOKEN_ID}], found {shown(t)}")
    out.append(int(t))
  return out


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # TokenBytes -> {key: table}


def compiled(tokenizer, key: Hashable, build: Callable[[TokenBytes], T]) -> T:
  """`build(token_bytes(tokenizer))`, made once per tokenizer vocabulary and `key` (the stop tables of every step
  boundary and the answer-line tables live here), then cached for as long as the tokenizer lives."""
  tb = token_bytes(tokenizer)
  cache = _TABLES.setdefault(tb, {})
  if key not in cache:
    cache[key] = build(tb)
  return cache[key]
