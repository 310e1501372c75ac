"""A rank that prints its TMPDIR and what is in it (tests/unit/launch/test_session_dir.py)."""

import json
import os

tmp = os.environ.get("TMPDIR", "")
print("TMPDIR " + json.dumps([tmp, sorted(os.listdir(tmp)) if tmp else []]), flush=True)
