"""Build the project's small CLIP-, T5-, Qwen2- and Mistral-style tokenizers from data/tokenizers/corpus.txt.

The real pipelines ship CLIP's 49k-token BPE vocabulary, T5's 32k-token SentencePiece vocabulary, Qwen2.5's 151k and
Mistral's 131k byte-level BPE vocabularies; none can be downloaded here, so we train small ones on our own prompt
corpus. Each is laid out like the original (same pre-tokenisation, same special tokens) and saved through a
transformers class, so `CLIPTokenizer`, `T5TokenizerFast`, `Qwen2Tokenizer` and `PreTrainedTokenizerFast`
`.from_pretrained` load them offline. The two byte-level ones also learn the prompt templates their pipelines wrap
every prompt in (QwenImagePipeline's system prompt, Flux2Pipeline's system message), so those read as whole words
as they do in the real vocabularies (Qwen-Image's template prefix is then 34 tokens, the number of hidden states
QwenImagePipeline drops). The build is deterministic: rerunning it rewrites byte-identical files.

    python tools/build_tokenizers.py            # rebuild data/tokenizers/{clip,t5,qwen2,mistral3}
    python tools/build_tokenizers.py --check    # rebuild into a temporary folder and compare
"""

from __future__ import annotations

import argparse
import filecmp
import itertools
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import Unigram
from transformers import CLIPTokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer, T5TokenizerFast

ROOT = Path(__file__).resolve().parent.parent
TOKENIZERS_DIR = ROOT / "data" / "tokenizers"
CORPUS = TOKENIZERS_DIR / "corpus.txt"

# Targets for training; the exact final sizes are printed and recorded in data/configs (smoke vocab sizes).
CLIP_MAX_MERGES = 1500
T5_TRAIN_VOCAB = 1024
T5_EXTRA_IDS = 100

CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"
# CLIP's own pre-tokenisation pattern, as transformers' CLIPTokenizer rebuilds it.
CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]  # ids 0, 1, 2 as in T5 (transformers hard-codes unk_id=2)
BYTE_LEVEL_MAX_MERGES = 1500
# Qwen2's pre-tokenisation pattern (its tokenizer.json), and the chat markers QwenImagePipeline's template uses.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
              r"\s+(?!\S)|\s+")
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# QwenImagePipeline.prompt_template_encode (diffusers 0.42), with {} where the prompt goes
QWEN_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                 "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
                 "<|im_start|>assistant\n")
# Mistral's control tokens at their ids (0-19), the ones the pipeline's chat and the vision tower name among them
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
                    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                    "[TOOL_CONTENT]"]
# Flux2Pipeline's SYSTEM_MESSAGE (diffusers 0.42, pipelines/flux2/system_messages.py)
FLUX2_SYSTEM = ("You are an AI that reasons about image descriptions. You give structured responses focusing on object "
                "relationships, object\nattribution and actions without speculation.")
# Mistral's chat layout for a system message and user turns; a content list holds {"type": "text", "text": ...}
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set parts = message['content'] if message['content'] is not string "
    "else [{'type': 'text', 'text': message['content']}] %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{% for p in parts %}{{ p['text'] }}{% endfor %}"
    "[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{% for p in parts %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}{% else %}[IMG]{% endif %}{% endfor %}[/INST]"
    "{% else %}{% for p in parts %}{{ p['text'] }}{% endfor %}{{ eos_token }}{% endif %}{% endfor %}")
TEMPLATE_REPEATS = 4  # so that BPE (pairs seen at least twice) learns the templates' words whole


def read_corpus() -> list[str]:
    """The corpus lines, stripped, without blanks."""
    return [line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def _merge_pair(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    """word with every non-overlapping occurrence of pair, left to right, joined into one symbol."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def learn_bpe_merges(words: Counter[tuple[str, ...]], max_merges: int, min_count: int = 2) -> list[tuple[str, str]]:
    """Classic BPE: repeatedly merge the most frequent adjacent pair (ties: the smallest pair wins).

    The `tokenizers` BPE trainer breaks ties between equally frequent pairs in hash order, so two runs can
    produce the same merges in a different order; this small loop gives one answer. Pair counts are updated
    only for the words that contain the merged pair."""
    vocab = dict(words)
    counts: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[tuple[str, ...]]] = {}
    for word, freq in vocab.items():
        for pair in itertools.pairwise(word):
            counts[pair] += freq
            where.setdefault(pair, set()).add(word)
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges and counts:
        best = min(counts, key=lambda p: (-counts[p], p))
        if counts[best] < min_count:
            break
        merges.append(best)
        for word in sorted(where.pop(best, set())):
            freq = vocab.pop(word)
            for pair in itertools.pairwise(word):
                counts[pair] -= freq
                if counts[pair] <= 0:
                    del counts[pair]
                if pair in where:
                    where[pair].discard(word)
            merged = _merge_pair(word, best)
            vocab[merged] = vocab.get(merged, 0) + freq
            for pair in itertools.pairwise(merged):
                counts[pair] += freq
                where.setdefault(pair, set()).add(merged)
    return merges


def build_clip(lines: list[str], out: Path) -> CLIPTokenizer:
    """Learn byte-level BPE merges on CLIP's normalised, pre-tokenised words and save it as a CLIPTokenizer."""
    normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CLIP_SPLIT), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    words: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
            words[tuple(word[:-1]) + (word[-1] + "</w>",)] += 1
    merges = learn_bpe_merges(words, CLIP_MAX_MERGES)

    # Lay the vocabulary out like CLIP's: every byte, every byte ending a word, one entry per merge in merge
    # order, then the two special tokens last (CLIP's pooling with the legacy eos_token_id=2 takes the argmax id,
    # so <|endoftext|> must be the highest id).
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    tokens = alphabet + [c + "</w>" for c in alphabet]
    base = set(tokens)
    tokens += [t for t in dict.fromkeys(a + b for a, b in merges) if t not in base]
    tokens += [CLIP_BOS, CLIP_EOS]
    vocab = {tok: i for i, tok in enumerate(tokens)}

    tok = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)
    tok.save_pretrained(out)
    return tok


def canonical_pieces(pieces: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Make the Unigram trainer's output reproducible: same pieces, same order, same scores on every run.

    The trainer sums floats in hash order, so the piece set is stable but scores wobble in the last digits, and
    it adds the alphabet's characters it did not learn with scores min_score + k * 1e-4 in hash order. We round
    the scores, re-score those fallback characters in code-point order below every other piece, and sort."""
    low = min(s for _, s in pieces)
    band = low + 1e-4 * (sum(len(p) == 1 for p, _ in pieces) + 1)
    fallback = sorted(p for p, s in pieces if len(p) == 1 and s <= band)
    rescored = {p: round(low - 1e-3 * (i + 1), 8) for i, p in enumerate(fallback)}
    rounded = [(p, rescored.get(p, round(s, 8))) for p, s in pieces]
    return sorted(rounded, key=lambda ps: (-ps[1], ps[0]))


def build_t5(lines: list[str], out: Path) -> T5TokenizerFast:
    """Train a Unigram model with T5's pre-tokeniser and special ids and save it as a T5 tokenizer."""
    probe = Tokenizer(Unigram())
    probe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
    ])
    probe.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    printable = [chr(c) for c in range(33, 127)]
    trainer = trainers.UnigramTrainer(
        vocab_size=T5_TRAIN_VOCAB, special_tokens=T5_SPECIALS, unk_token="<unk>", show_progress=False,
        initial_alphabet=printable, max_piece_length=16,
    )
    probe.train_from_iterator(lines, trainer)
    pieces = [(p, float(s)) for p, s in json.loads(probe.to_str())["model"]["vocab"]]
    assert [p for p, _ in pieces[:3]] == T5_SPECIALS, pieces[:3]
    pieces = pieces[:3] + canonical_pieces(pieces[3:])
    # Like T5: the sentinel tokens close the vocabulary, <extra_id_99> first and <extra_id_0> last.
    pieces += [(f"<extra_id_{i}>", 0.0) for i in reversed(range(T5_EXTRA_IDS))]

    tok = T5TokenizerFast(vocab=pieces, extra_ids=T5_EXTRA_IDS, model_max_length=512)
    tok.save_pretrained(out)
    return tok


def byte_level_bpe(lines: list[str], split: str, specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE (GPT-2 style, as Qwen2 and Mistral's Tekken): specials first, then every byte, then one entry
    per merge in merge order."""
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    words: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        for word, _ in pre_tokenizer.pre_tokenize_str(line):
            words[tuple(word)] += 1
    merges = learn_bpe_merges(words, BYTE_LEVEL_MAX_MERGES)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
    tokens = list(dict.fromkeys([*specials, *alphabet, *(a + b for a, b in merges)]))
    return {tok: i for i, tok in enumerate(tokens)}, merges


def build_qwen2(lines: list[str], out: Path) -> Qwen2Tokenizer:
    """Byte-level BPE with Qwen2's pre-tokeniser and chat markers, saved as a Qwen2Tokenizer."""
    prefix, suffix = QWEN_TEMPLATE.split("{}")
    text = [*lines, *[prefix, suffix] * TEMPLATE_REPEATS]
    vocab, merges = byte_level_bpe(text, QWEN_SPLIT, QWEN_SPECIALS)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=131072)
    tok.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS[1:]})
    tok.save_pretrained(out)
    return tok


def build_mistral3(lines: list[str], out: Path) -> PreTrainedTokenizerFast:
    """Byte-level BPE with Mistral's control tokens and chat template, saved as a PreTrainedTokenizerFast.

    FLUX.2 [dev] ships a PixtralProcessor (tokenizer + image processor); transformers' Pixtral processor imports
    torchvision, which this project does not install, so the pipeline gets the tokenizer alone: for a text prompt the
    processor's apply_chat_template hands the work to it."""
    from tokenizers import models, processors

    vocab, merges = byte_level_bpe([*lines, *[FLUX2_SYSTEM] * TEMPLATE_REPEATS], QWEN_SPLIT, MISTRAL_SPECIALS)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>", model_max_length=131072, chat_template=MISTRAL_CHAT_TEMPLATE,
                                  extra_special_tokens={})
    tok.add_special_tokens({"additional_special_tokens": [t for t in MISTRAL_SPECIALS
                                                          if t not in ("<unk>", "<s>", "</s>", "<pad>")]})
    tok.save_pretrained(out)
    return tok


TOKENIZERS = ("clip", "t5", "qwen2", "mistral3")


def build(out_dir: Path) -> dict[str, int]:
    """Build every tokenizer under out_dir and return their sizes."""
    lines = read_corpus()
    clip = build_clip(lines, out_dir / "clip")
    t5 = build_t5(lines, out_dir / "t5")
    qwen2 = build_qwen2(lines, out_dir / "qwen2")
    mistral3 = build_mistral3(lines, out_dir / "mistral3")
    return {"clip": len(clip), "t5": len(t5), "qwen2": len(qwen2), "mistral3": len(mistral3)}


def same_tree(a: Path, b: Path) -> bool:
    """True when both folders hold the same file names with identical bytes."""
    names_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    names_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return names_a == names_b and all(filecmp.cmp(a / n, b / n, shallow=False) for n in names_a)


def main(argv: list[str] | None = None) -> int:
    """Command line: build into data/tokenizers, or with --check verify the shipped files are up to date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="rebuild in a temp folder and compare")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            sizes = build(Path(tmp))
            ok = all(same_tree(Path(tmp) / name, TOKENIZERS_DIR / name) for name in TOKENIZERS)
        print(f"sizes {sizes}; shipped files {'match' if ok else 'DIFFER from'} a fresh build")
        return 0 if ok else 1
    sizes = build(TOKENIZERS_DIR)
    print(f"wrote under {TOKENIZERS_DIR}: " + ", ".join(f"{name} ({n} tokens)" for name, n in sizes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
