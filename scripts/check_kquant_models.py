#!/usr/bin/env python3
"""Checks kvmesh on real K-quant and IQ4 GGUF files: SmolLM2-135M-Instruct (the Q4_1 file) is
requantised by llama.cpp's own quantiser (llama-cpp-python's llama_model_quantize) into the mixes
llama.cpp users download (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS, ...), and on each file kvmesh's
last-position logits are compared with two independent references over the same file:

  * "exact": tests/tools/numpy_llama.py, a float64 NumPy forward pass over the weights as the
    `gguf` package dequantises them;
  * "llama.cpp": llama-cpp-python's logits (its own int8 activations and fp16 rounding).

SmolLM2's 576-wide rows are not a multiple of 256, so llama.cpp stores most matrices in each
mix's fallback (Q5_0, Q5_1, Q8_0, IQ4_NL) and only ffn_down (1536 wide) in the K-quant itself;
the script prints each file's tensor types. kvmesh runs twice: with its packed weights, and
with --no-repack (the row-major dots and the dequantise-once products). No test depends on it (CI does not build llama.cpp);
it is the real-file check behind engine.md "Packed weights".

  pip install numpy gguf llama-cpp-python==0.3.36
  python3 scripts/check_kquant_models.py [--kvmesh build/bin/kvmesh] [--model Q4_1.gguf]
      [--out DIR] [--mixes Q4_K_M,Q3_K_M]

Q2_K_S and the IQ1-IQ3 mixes need an importance matrix, which this script does not make, so Q2_K
tensors themselves are covered by the tests' fixtures, not here.

Exit status 1 if kvmesh's top token (either run) differs from the exact one where the exact top two are more
than 0.05 apart, or kvmesh is further from the exact logits than llama.cpp is (on the exact
top-20) by more than 0.05 plus a third.
"""
import argparse
import collections
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
from gguf import GGUFReader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tools"))
from numpy_llama import NumpyLlama  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "KV caches let decoding reuse the keys and values of earlier tokens, so",
]


def quantize(src, dst, mix):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + mix)
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize {mix}: {rc}")


def tensor_types(path):
    counts = collections.Counter(t.tensor_type.name for t in GGUFReader(path).tensors)
    return ", ".join(f"{n} {c}" for n, c in sorted(counts.items(), key=lambda x: -x[1]))


def kvmesh_logits(binary, model, prompt, k, flags=()):
    out = subprocess.run([binary, "logits", "--prompt", prompt, "--model", model, "--top-k",
                          str(k), *flags], check=True, capture_output=True, text=True).stdout
    return {int(i): float(v) for i, v in json.loads(out)}


def kvmesh_tokens(binary, model, prompt):
    out = subprocess.run([binary, "tokenize", "--text", prompt, "--model", model], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvmesh", default=os.path.join(HERE, "..", "build", "bin", "kvmesh"))
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/kvmesh/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/kvmesh/kquant"))
    ap.add_argument("--mixes", default="Q4_K_M,Q5_K_M,Q3_K_M,Q2_K,IQ4_XS,IQ4_NL,Q6_K")
    args = ap.parse_args()
    from llama_cpp import Llama
    os.makedirs(args.out, exist_ok=True)
    ok = True
    print("| mix | tensor types | prompt | top-1 exact / kvmesh / llama.cpp | top-20 max abs diff "
          "from exact: kvmesh / kvmesh --no-repack / llama.cpp |")
    print("|---|---|---|---|---|")
    for mix in args.mixes.split(","):
        path = os.path.join(args.out, f"SmolLM2-135M-Instruct.{mix}.gguf")
        if not os.path.exists(path):
            quantize(args.model, path, mix)
        types = tensor_types(path)
        exact = NumpyLlama(path)
        llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=2, verbose=False, logits_all=True)
        for pi, prompt in enumerate(PROMPTS):
            ids = kvmesh_tokens(args.kvmesh, path, prompt)
            ref = exact.logits(ids)
            top = np.argsort(-ref)[:20]
            llm.reset()
            llm.eval(ids)
            lc = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
            kv = kvmesh_logits(args.kvmesh, path, prompt, 20)
            rows = kvmesh_logits(args.kvmesh, path, prompt, 20, ["--no-repack"])
            missing = [int(t) for t in top if int(t) not in kv]
            d_kv = max(abs(kv[int(t)] - ref[t]) for t in top if int(t) in kv)
            d_rows = max(abs(rows[int(t)] - ref[t]) for t in top if int(t) in rows)
            rows_top = max(rows, key=rows.get)
            d_lc = float(np.max(np.abs(lc[top] - ref[top])))
            kv_top = max(kv, key=kv.get)
            gap = ref[top[0]] - ref[top[1]]
            line_ok = all((t == int(top[0]) or gap <= 0.05) and d <= d_lc * 4 / 3 + 0.05
                          for t, d in ((kv_top, d_kv), (rows_top, d_rows)))
            ok &= line_ok and len(missing) <= 2
            print(f"| {mix} | {types if pi == 0 else ''} | {pi} | {int(top[0])} / {kv_top} / "
                  f"{int(np.argmax(lc))} | {d_kv:.4f} / {d_rows:.4f} / {d_lc:.4f}"
                  f"{'' if line_ok else ' (FAIL)'}{f' (missing {missing})' if missing else ''} |",
                  flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
