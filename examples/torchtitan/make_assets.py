"""Writes the small assets TorchTitan's Llama3 debug model reads, without the network.

TorchTitan's ``llama3_debugmodel`` config points at ``tests/assets/tokenizer`` and the
``c4_test`` dataset, which live in TorchTitan's source repository but not in its wheel.
This script writes stand-ins of the same shape: a word-level tokenizer with the debug
model's vocabulary size (2048, BOS and EOS included) and a ``train.json`` of generated
sentences. Both are a pure function of the seed, so every run (and every rank) sees the
same tokens.

    python examples/torchtitan/make_assets.py /tmp/titan-assets
    # -> /tmp/titan-assets/tokenizer/{tokenizer.json,tokenizer_config.json}
    #    /tmp/titan-assets/c4_test/train.json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

__all__ = ["VOCAB_SIZE", "write_assets"]

VOCAB_SIZE = 2048  # the debug model's vocab_size
SPECIAL = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]


def _words() -> list[str]:
    return [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIAL))]


def write_assets(folder: Path, documents: int = 400, seed: int = 0) -> tuple[Path, Path]:
    """Writes the tokenizer and the dataset under ``folder``; returns their two folders."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = Path(folder)
    tokenizer_dir, data_dir = folder / "tokenizer", folder / "c4_test"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)

    vocab = {token: i for i, token in enumerate(SPECIAL + _words())}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
    }, indent=1))

    # Sentences with a learnable structure (each word tends to follow its predecessor's
    # neighbours), so the loss falls over the first steps as on real text.
    rng = random.Random(seed)
    words = _words()
    lines = []
    for _ in range(documents):
        index = rng.randrange(len(words))
        tokens = []
        for _ in range(rng.randrange(200, 600)):
            index = (index + rng.choice((1, 1, 2, 3, 7))) % len(words)
            tokens.append(words[index])
        lines.append(json.dumps({"text": " ".join(tokens)}))
    (data_dir / "train.json").write_text("\n".join(lines) + "\n")
    return tokenizer_dir, data_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="where to write tokenizer/ and c4_test/")
    args = parser.parse_args()
    tokenizer_dir, data_dir = write_assets(args.folder)
    print(f"--hf_assets_path {tokenizer_dir} --dataloader.dataset_path {data_dir}")


if __name__ == "__main__":
    main()
