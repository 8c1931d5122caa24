#!/usr/bin/env python3
"""Write tests/assets/c4_test/data.json, the documents of the named dataset `c4_test`:

    python scripts/make_c4_test.py [--out tests/assets/c4_test/data.json]

Upstream torchtitan's TOMLs train on `c4_test`, a 2K-document sample of C4 in JSON Lines
({"text": ...} per line). C4's text is not ours to ship, so ours is the same shape built from
text every CPython ships: the documentation topics of `pydoc_data.topics` (the corpus of the
'pydoc' dataset, torchtitan/data/corpus.py), one document per paragraph, a paragraph shorter
than MIN_CHARS (a heading, a one-line lead-in) joined to the one after it. Topics in name
order: the output depends only on the Python version's topics (GENERATED_WITH made the
committed file; tests/unit/test_c4_datasets.py checks it when run on that version).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "assets", "c4_test", "data.json")
MIN_CHARS = 48  # a paragraph shorter than this opens the next document instead of being one
GENERATED_WITH = "3.11"  # the Python (major.minor) whose topics are in the committed file


def documents() -> list[str]:
    """The documents, in order."""
    from pydoc_data.topics import topics

    docs = []
    for name in sorted(topics):
        pending = ""
        for para in topics[name].split("\n\n"):
            para = para.strip("\n").rstrip()
            if not para.strip():
                continue
            pending = f"{pending}\n\n{para}" if pending else para
            if len(pending) >= MIN_CHARS:
                docs.append(pending)
                pending = ""
        if pending:  # a topic's short tail stays a document of its own topic
            docs.append(pending)
    return docs


def render(docs: list[str]) -> str:
    """The file's text: one JSON object per line."""
    return "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=OUT, help="the file to write (default: %(default)s)")
    args = ap.parse_args(argv)
    docs = documents()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(render(docs))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    print(
        f"{args.out}: {len(docs)} documents, {os.path.getsize(args.out)} bytes (Python {version})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
