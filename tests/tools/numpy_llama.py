"""A plain float64 NumPy Llama forward pass over a GGUF (weights dequantised by the `gguf`
package). Slow and simple: a second independent reference for debugging the engine."""
import sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class NumpyLlama:
    def __init__(self, path):
        r = GGUFReader(path)
        f = lambda k: r.fields[k].parts[r.fields[k].data[0]][0]
        self.n_layers = int(f('llama.block_count'))
        self.n_heads = int(f('llama.attention.head_count'))
        self.n_kv = int(f('llama.attention.head_count_kv'))
        self.eps = float(f('llama.attention.layer_norm_rms_epsilon'))
        self.theta = float(f('llama.rope.freq_base'))
        self.t = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.t[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a

    def greedy(self, tokens, n):
        """n greedy tokens after `tokens`, with the gap between the top two logits at each step."""
        out, gaps = [], []
        lg = self.logits(tokens)
        for _ in range(n):
            top2 = np.argsort(-lg)[:2]
            out.append(int(top2[0]))
            gaps.append(float(lg[top2[0]] - lg[top2[1]]))
            lg = self.extend([top2[0]])
        return out, gaps

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x [T, H, D], adjacent pairs
        d = x.shape[-1]
        inv = self.theta ** (-np.arange(0, d, 2) / d)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def reset(self):
        self.cache = [(None, None) for _ in range(self.n_layers)]
        self.n_past = 0

    def logits(self, tokens):
        """Fresh context: logits at the last position of `tokens`."""
        self.reset()
        return self.extend(tokens)

    def extend(self, tokens):
        """Appends `tokens` to the cached context; returns logits at the last position."""
        tokens = np.asarray(tokens)
        T = len(tokens)
        P = self.n_past
        x = self.t['token_embd.weight'][tokens]
        E = x.shape[1]
        hd = E // self.n_heads
        pos = np.arange(P, P + T, dtype=np.float64)
        mask = np.triu(np.full((T, P + T), -np.inf), P + 1)
        for l in range(self.n_layers):
            p = f'blk.{l}.'
            h = self.rms(x, self.t[p + 'attn_norm.weight'])
            q = (h @ self.t[p + 'attn_q.weight'].T).reshape(T, self.n_heads, hd)
            k = (h @ self.t[p + 'attn_k.weight'].T).reshape(T, self.n_kv, hd)
            v = (h @ self.t[p + 'attn_v.weight'].T).reshape(T, self.n_kv, hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            pk, pv = self.cache[l]
            if pk is not None:
                k, v = np.concatenate([pk, k]), np.concatenate([pv, v])
            self.cache[l] = (k, v)
            g = self.n_heads // self.n_kv
            k = np.repeat(k, g, axis=1); v = np.repeat(v, g, axis=1)
            s = np.einsum('thd,shd->hts', q, k) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
            o = np.einsum('hts,shd->thd', s, v).reshape(T, E)
            x = x + o @ self.t[p + 'attn_output.weight'].T
            h = self.rms(x, self.t[p + 'ffn_norm.weight'])
            gg = h @ self.t[p + 'ffn_gate.weight'].T
            u = h @ self.t[p + 'ffn_up.weight'].T
            x = x + ((gg / (1 + np.exp(-gg))) * u) @ self.t[p + 'ffn_down.weight'].T
        self.n_past += T
        x = self.rms(x[-1], self.t['output_norm.weight'])
        out = self.t.get('output.weight', self.t['token_embd.weight'])
        return out @ x
