"""Files: atomic writes (a file or folder appears complete or not at all) and readers of text, JSON and JSONL that
name the file and line of any defect. Every stored artifact and user file goes through here."""
