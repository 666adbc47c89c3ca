#!/usr/bin/env python3
"""Regenerates the fuzzers' seed corpora under tests/fuzz/seeds/ (small GGUF files written by the
`gguf` package's GGUFWriter, and tokenizer inputs).   pip install numpy gguf"""
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

HERE = os.path.dirname(os.path.abspath(__file__))


def gguf_seed(path, arch, tensors, extra_kv=True):
    w = GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    if extra_kv:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(["a", "b", "ab", "<|im_end|>"])
        w.add_token_types([1, 1, 1, 3])
        w.add_token_merges(["a b"])
        w.add_eos_token_id(3)
        w.add_chat_template("<|im_start|>system\nHi<|im_end|>")
        w.add_array("test.nested", [[1, 2], [3]])
        w.add_float64("test.f64", 0.25)
    for name, arr, raw_dtype in tensors:
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    rng = np.random.default_rng(5)
    d = os.path.join(HERE, "seeds", "gguf")
    f32 = rng.standard_normal((2, 32)).astype(np.float32)
    gguf_seed(os.path.join(d, "f32.gguf"), "llama", [("token_embd.weight", f32, None)])
    q8 = rng.integers(0, 256, size=(2, 34), dtype=np.uint8)
    q8[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes() * 2, dtype=np.uint8).reshape(2, 2)
    gguf_seed(os.path.join(d, "q8_0.gguf"), "llama", [("blk.0.attn_q.weight", q8, T.Q8_0)])
    gguf_seed(os.path.join(d, "kv_only.gguf"), "gpt2", [], extra_kv=False)
    t = os.path.join(HERE, "seeds", "tokenizer")
    samples = {
        "ascii.txt": b"Hello world, it's 2026! The quick brown fox.",
        "chat.txt": b"<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n",
        "unicode.txt": "caf\u00e9 \u6771\u4eac \U0001F600 \u0645\u0631\u062d\u0628\u0627".encode(),
        "code.txt": b"def f(x):\n\treturn x ** 2  # square\n",
        "spaces.txt": b"a   b\t\t\n\n  c \r\n",
        "bytes.bin": bytes(range(256)),
    }
    for name, data in samples.items():
        with open(os.path.join(t, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
