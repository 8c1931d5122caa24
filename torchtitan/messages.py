"""Error text for one-line messages (config errors, data errors, export failures)."""


def one_line(error: object, limit: int = 200) -> str:
    """`error` (an exception or any object) as one line of at most `limit` characters:
    whitespace runs, newlines included, become one space; an empty text gives the type name."""
    text = " ".join(str(error).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text or type(error).__name__
