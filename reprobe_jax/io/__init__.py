"""Files: atomic writes (a file or folder appears complete or not at all) and the JSON / JSONL writers built on them
(`atomic`), readers of text, JSON and JSONL that name the file and line of any defect (`readers`), and seals: a
content hash beside a stored file, checked when it is read back, and the check that a path is a regular file
(`seal`). Every stored artifact and user file goes through here."""

from reprobe_jax.io.atomic import atomic_folder, atomic_open, seal_folder, write_json, write_jsonl, write_seal
from reprobe_jax.io.readers import read_json, read_jsonl, read_text, shown
from reprobe_jax.io.seal import check_folder, check_seal, file_digest, is_sealed, regular_file

__all__ = [
  "atomic_folder",
  "atomic_open",
  "check_folder",
  "check_seal",
  "file_digest",
  "is_sealed",
  "read_json",
  "read_jsonl",
  "read_text",
  "regular_file",
  "seal_folder",
  "shown",
  "write_json",
  "write_jsonl",
  "write_seal",
]
