"""Tokenizer: any Hugging Face tokenizer.json, with BOS/EOS found by their usual names."""

import os

from tokenizers import Tokenizer as HFTokenizer

BUNDLED_TOKENIZER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "tokenizer.json")

# (bos, eos) names in the order we look for them: Llama3, Llama2/SentencePiece style, GPT-2 style.
_SPECIAL_PAIRS = [
    ("<|begin_of_text|>", "<|end_of_text|>"),
    ("<s>", "</s>"),
    ("<|endoftext|>", "<|endoftext|>"),
]


class Tokenizer:
    def __init__(self, path: str = ""):
        path = os.path.expanduser(path) if path else BUNDLED_TOKENIZER
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        self.path = path
        self._tok = HFTokenizer.from_file(path)
        vocab = self._tok.get_vocab(with_added_tokens=True)
        for bos, eos in _SPECIAL_PAIRS:
            if bos in vocab and eos in vocab:
                self.bos_id, self.eos_id = vocab[bos], vocab[eos]
                break
        else:
            raise ValueError(
                f"tokenizer '{path}' has none of the BOS/EOS token pairs {_SPECIAL_PAIRS}"
            )
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, bos: bool = True, eos: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)
