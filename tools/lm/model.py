"""A Llama-architecture decoder in plain PyTorch, laid out as HuggingFace's LlamaForCausalLM (the
same parameter names, RoPE convention and norms), so its state dict is a checkpoint transformers
and tailserve load as they are."""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaShape:
    vocab_size: int
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    intermediate_size: int = 1024
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def hf_config(self, bos_token_id, eos_token_id):
        c = asdict(self)
        # transformers 5's keys, as ../shared/reference's checkpoints have them.
        c["rope_parameters"] = {"rope_theta": c.pop("rope_theta"), "rope_type": "default"}
        c.update({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "initializer_range": 0.02,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "dtype": "bfloat16",
            "use_cache": True,
        })
        return c


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_tables(shape, positions, device):
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2, device=device).float() / shape.head_dim))
    # transformers keeps the frequencies in a buffer cast with the model, so a bf16 checkpoint runs
    # with bf16-rounded ones (and tailserve's engines do the same): train with what is served.
    inv = inv.to(torch.bfloat16).float()
    f = torch.outer(torch.arange(positions, device=device).float(), inv)
    emb = torch.cat((f, f), dim=-1)  # HF: the two halves, not interleaved pairs
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # torch 2 (the device machine's)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]  # torch 1.13 (Debian 12's): the same maths, unfused
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return scores.float().masked_fill(mask, float("-inf")).softmax(-1).to(q.dtype) @ v


class Attention(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.num_attention_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_attention_heads * s.head_dim, s.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        s = self.s
        q = self.q_proj(x).view(b, t, s.num_attention_heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        cos, sin = cos[:t].to(q.dtype), sin[:t].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = s.num_attention_heads // s.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = causal_attention(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Mlp(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = Mlp(s)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.num_hidden_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.shape = s
        self.model = Body(s)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        if s.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init)
        # GPT-2's scaled init of the residual projections keeps the stream's variance flat in depth.
        for layer in self.model.layers:
            for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * s.num_hidden_layers))
        self.rope = None

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):
        if self.rope is None or self.rope[0].device != ids.device or self.rope[0].shape[0] < ids.shape[1]:
            self.rope = rope_tables(self.shape, max(ids.shape[1], 64), ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, *self.rope)
        return self.lm_head(self.model.norm(x))

    def hf_state_dict(self):
        """Parameters under HuggingFace's names; the tied head is left out, as HF writes it."""
        sd = {k: v for k, v in self.state_dict().items()}
        if self.shape.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd
