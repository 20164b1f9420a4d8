"""Files: atomic writes (a file or folder appears complete or not at all) and the JSON / JSONL writers built on them
(`atomic`), and readers of text, JSON and JSONL that name the file and line of any defect (`readers`). Every stored
artifact and user file goes through here."""

from reprobe_jax.io.atomic import atomic_folder, atomic_open, write_json, write_jsonl
from reprobe_jax.io.readers import read_json, read_jsonl, read_text, shown

__all__ = ["atomic_folder", "atomic_open", "read_json", "read_jsonl", "read_text", "shown", "write_json", "write_jsonl"]
