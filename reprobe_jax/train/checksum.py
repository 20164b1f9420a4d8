"""The checksum a `Trainer` checkpoint carries (docs/reliability.md): a sha256 of the saved state's bytes and one of
its JSON meta, written with each save and compared on restore, so a data file changed in place (its size and
orbax's own metadata intact) is refused instead of resumed with other parameters.

    stamp = {"meta": meta_digest(meta), "state": state_digests(state)}   # stored in the meta as "checksum"

`state_digests` hashes every leaf in the tree's fixed order as (path, dtype, shape, then each piece: its index and its
bytes). A process hashes what it can address: an array it holds whole is one piece (so the digest does not depend on
how it is laid out over local devices, and a process-local array equals its replicated global copy); an array of a
multi-process job is one piece per distinct shard index its devices hold. On a multi-process job the per-process
digests are gathered, so every process stores and compares the same list, entry p being process p's.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

KEY = "checksum"  # the meta field the stamp is stored in (left out of the meta's own digest)


def meta_digest(meta: dict) -> str:
  """sha256 hex of the meta as JSON (keys sorted), without its checksum field."""
  body = {k: v for k, v in meta.items() if k != KEY}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _bounds(index, shape) -> tuple[tuple[int, int], ...]:
  """A shard's index as (start, stop) per axis (a whole axis spelled the same whether given as ':' or explicitly)."""
  return tuple((s.start or 0, dim if s.stop is None else s.stop) for s, dim in zip(index, shape))


def _pieces(x: Any) -> list[tuple[tuple, np.ndarray]]:
  """(index bounds, host array) of what this process holds of one leaf, in index order."""
  if isinstance(x, jax.Array):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if not x.is_fully_addressable:
      shards = {}
      for s in x.addressable_shards:
        shards.setdefault(_bounds(s.index, x.shape), s.data)
      return [(k, np.asarray(shards[k])) for k in sorted(shards)]
  host = np.asarray(x)
  return [(tuple((0, d) for d in host.shape), host)]


def local_digest(state: Any) -> str:
  """sha256 hex of the leaves of `state` this process addresses: per leaf (path, dtype, shape), then each piece's
  index and bytes, every part length-framed."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    pieces = _pieces(leaf)
    host = pieces[0][1]
    shape = tuple(getattr(leaf, "shape", host.shape))
    h.update(f"{jax.tree_util.keystr(path)}|{host.dtype}|{shape}|{len(pieces)}\n".encode())
    for index, a in pieces:
      data = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
      h.update(f"{index}|{data.size}\n".encode())
      h.update(data)
  return h.hexdigest()


def state_digests(state: Any) -> list[str]:
  """Every process's `local_digest` of `state`, in process order (one entry on a single process). On a multi-process
  job every process must call it (it gathers)."""
  mine = local_digest(state)
  if jax.process_count() == 1:
    return [mine]
  rows = multihost_utils.process_allgather(np.frombuffer(bytes.fromhex(mine), np.uint8))  # [processes, 32]
  return [bytes(np.asarray(r, np.uint8)).hex() for r in np.asarray(rows).reshape(jax.process_count(), -1)]


def stamp(meta: dict, state: Any) -> dict:
  """The checksum stored with a checkpoint of `state` whose meta is `meta` (JSON values only)."""
  return {"meta": meta_digest(meta), "state": state_digests(state)}


def well_formed(value: Any) -> bool:
  """Whether a stored checksum has the shape `stamp` writes: 64-hex digests, one or more for the state."""
  hexes = lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)  # noqa: E731
  return (
    isinstance(value, dict)
    and hexes(value.get("meta"))
    and isinstance(value.get("state"), list)
    and len(value["state"]) >= 1
    and all(map(hexes, value["state"]))
  )


def same_state(stored: list[str], now: list[str]) -> bool:
  """Whether the state digests match: entry by entry, or, where every process of both jobs held the same bytes (a
  replicated state, saved and restored by different process counts), the one digest they share."""
  return stored == now or (len(set(stored)) == 1 and set(now) == set(stored))
