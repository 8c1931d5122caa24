"""Tokenizer: any Hugging Face tokenizer.json, with BOS/EOS found by their usual names."""

import json
import os

from tokenizers import Tokenizer as HFTokenizer

from torchtitan.messages import one_line

BUNDLED_TOKENIZER = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "assets", "tokenizer.json"
)

# (bos, eos) names in the order we look for them: Llama3, Llama2/SentencePiece style, GPT-2 style.
_SPECIAL_PAIRS = [
    ("<|begin_of_text|>", "<|end_of_text|>"),
    ("<s>", "</s>"),
    ("<|endoftext|>", "<|endoftext|>"),
]


class TokenizerError(ValueError):
    """The file is not a usable tokenizer. `reason` says why in a few words, `kind` is
    "unreadable" (not an HF tokenizer.json) or "no_bos_eos"; the message is one line."""

    def __init__(self, path: str, kind: str, reason: str, message: str = ""):
        self.path, self.kind, self.reason = path, kind, reason
        super().__init__(message or f"tokenizer '{path}' is not an HF tokenizer.json: {reason}")


def _why_unloadable(path: str, error: Exception) -> str:
    """Why `tokenizers` could not load the file, in words a user recognises (its own messages
    speak of serde variants and columns); only called after a failure, so the file is read twice
    only then."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return f"cannot read it ({e.strerror or e})"
    if not data.strip():
        return "the file is empty"
    try:
        obj = json.loads(data)
    except UnicodeDecodeError:
        return "not a text file (not UTF-8)"
    except ValueError as e:
        return f"not JSON ({e})"
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not a tokenizer object"
    if not isinstance(obj.get("model"), dict):
        keys = ", ".join(list(obj)[:8]) + (", ..." if len(obj) > 8 else "") or "none"
        return f"JSON, but no tokenizer 'model' in it (its keys: {keys})"
    return f"the tokenizers library cannot load it ({one_line(error, 160)})"


class Tokenizer:
    def __init__(self, path: str = ""):
        path = os.path.expanduser(path) if path else BUNDLED_TOKENIZER
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        self.path = path
        try:
            self._tok = HFTokenizer.from_file(path)
        except Exception as e:
            # tokenizers reports a bad or missing file as a plain Exception, nothing narrower;
            # any subclass (TypeError, ...) is not about the file: its traceback
            if type(e) is not Exception and not isinstance(e, OSError):
                raise
            raise TokenizerError(path, "unreadable", _why_unloadable(path, e)) from None
        vocab = self._tok.get_vocab(with_added_tokens=True)
        for bos, eos in _SPECIAL_PAIRS:
            if bos in vocab and eos in vocab:
                self.bos_id, self.eos_id = vocab[bos], vocab[eos]
                break
        else:
            pairs = ", ".join(f"{bos} {eos}" if bos != eos else bos for bos, eos in _SPECIAL_PAIRS)
            raise TokenizerError(
                path,
                "no_bos_eos",
                f"none of the BOS/EOS token pairs {pairs}",
                f"tokenizer '{path}' has none of the BOS/EOS token pairs {_SPECIAL_PAIRS}",
            )
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # A tokenizer whose only special token ends documents (GPT-2's and Qwen's <|endoftext|>)
        # has no BOS: documents are then written as text + EOS and told apart after each EOS.
        self.has_bos = self.bos_id != self.eos_id
        self._fingerprint = ""

    @property
    def doc_delimiter(self) -> tuple[int, bool]:
        """(token id, True: a document starts at it | False: ends at it): the block-causal mask's documents."""
        return (self.bos_id, True) if self.has_bos else (self.eos_id, False)

    @property
    def delimiting(self) -> str:
        """How packed documents are told apart, in words (the start line and manifests say it)."""
        if self.has_bos:
            return "BOS + text + EOS; a document starts at each BOS"
        return "text + EOS (no BOS token); a document starts after each EOS"

    @property
    def fingerprint(self) -> str:
        """sha256 of the tokenizer's canonical JSON: same text in, same ids out."""
        if not self._fingerprint:
            import hashlib

            self._fingerprint = hashlib.sha256(self._tok.to_str().encode()).hexdigest()
        return self._fingerprint

    def encode(self, text: str, bos: bool = True, eos: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return (
            ([self.bos_id] if bos and self.has_bos else []) + ids + ([self.eos_id] if eos else [])
        )

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def tokenizer_file(model_cfg) -> str:
    """The tokenizer a job's [model] names: tokenizer_path; when it is empty, upstream's
    <hf_assets_path>/tokenizer.json; "" (the bundled tokenizer) when both are empty."""
    if model_cfg.tokenizer_path or not model_cfg.hf_assets_path:
        return model_cfg.tokenizer_path
    return os.path.join(model_cfg.hf_assets_path, "tokenizer.json")


def load_model_tokenizer(model_cfg) -> Tokenizer:
    """load_tokenizer of the job's tokenizer (tokenizer_file)."""
    return load_tokenizer(tokenizer_file(model_cfg))


_LOADED: dict[str, Tokenizer] = {}


def load_tokenizer(path: str = "") -> Tokenizer:
    """The tokenizer at `path` ("" = the bundled one), loaded once per process: the checks,
    the model's args and the data all ask for it (a failed load is not kept)."""
    key = os.path.abspath(os.path.expanduser(path)) if path else BUNDLED_TOKENIZER
    if key not in _LOADED:
        _LOADED[key] = Tokenizer(path)
    return _LOADED[key]
