"""The embedded default corpus: Python's own documentation topics, split into documents.

`pydoc_data.topics` ships with CPython (~465 KB of English prose), so the default run and
the tests need no network and no download.
"""

MIN_DOC_CHARS = 1000

# Local data files we stream with HF datasets: extension -> datasets builder name.
LOCAL_FILE_BUILDERS = {
    ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv", ".arrow": "arrow",
}


def pydoc_documents() -> list[str]:
    """Topics split at blank lines and regrouped into documents of >= MIN_DOC_CHARS characters."""
    from pydoc_data.topics import topics

    docs = []
    for name in sorted(topics):
        current = ""
        for para in topics[name].split("\n\n"):
            current = f"{current}\n\n{para}" if current else para
            if len(current) >= MIN_DOC_CHARS:
                docs.append(current)
                current = ""
        if current.strip():
            docs.append(current)
    return docs
