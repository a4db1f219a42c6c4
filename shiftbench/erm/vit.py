"""ViT-B/16 in plain torch, as torchvision's ``vit_b_16`` defines it (ConDS Table 1's ViT).

Layer by layer and name by name torchvision's ``VisionTransformer`` (``conv_proj``, ``class_token``,
``encoder.pos_embedding``, ``encoder.layers.encoder_layer_0.self_attention.in_proj_weight``, ``heads.head`` ...), so
its ``state_dict`` loads here and gives the same outputs (``tests/test_torchvision_parity.py``). The position
embedding's length follows ``image_size`` (224: 197 tokens); a torchvision checkpoint at 224 loads only at 224.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn


class _EncoderBlock(nn.Module):
    """Pre-norm self-attention and MLP, each added to its input."""

    def __init__(self, heads: int, hidden: int, mlp: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-6)
        linears = nn.Linear(hidden, mlp), nn.Linear(mlp, hidden)
        for layer in linears:  # torchvision's MLPBlock initialisation
            nn.init.xavier_uniform_(layer.weight)
            nn.init.normal_(layer.bias, std=1e-6)
        self.mlp = nn.Sequential(linears[0], nn.GELU(), nn.Dropout(0.0), linears[1], nn.Dropout(0.0))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(tokens)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + tokens
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out


class _Encoder(nn.Module):
    def __init__(self, tokens: int, layers: int, heads: int, hidden: int, mlp: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, tokens, hidden).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(
            OrderedDict((f"encoder_layer_{k}", _EncoderBlock(heads, hidden, mlp)) for k in range(layers))
        )
        self.ln = nn.LayerNorm(hidden, eps=1e-6)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.ln(self.layers(self.dropout(tokens + self.pos_embedding)))
        return out


class VisionTransformer(nn.Module):
    """Patches of ``patch`` pixels embedded by one strided convolution, a class token, a Transformer encoder, and a
    linear head on the class token (``heads.head``, zero-initialised as torchvision's)."""

    head_name = "heads.head"

    def __init__(
        self, num_classes: int, image_size: int = 224, patch: int = 16, layers: int = 12, heads: int = 12,
        hidden: int = 768, mlp: int = 3072,
    ) -> None:  # fmt: skip
        super().__init__()
        self.patch, self.hidden = patch, hidden
        self.conv_proj = nn.Conv2d(3, hidden, patch, patch)
        fan_in = 3 * patch * patch
        nn.init.trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / fan_in))
        nn.init.zeros_(self.conv_proj.bias)  # type: ignore[arg-type]
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.encoder = _Encoder((image_size // patch) ** 2 + 1, layers, heads, hidden, mlp)
        head = nn.Linear(hidden, num_classes)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        self.heads = nn.Sequential(OrderedDict(head=head))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.conv_proj(x).flatten(2).transpose(1, 2)  # [B, tokens, hidden]
        tokens = torch.cat([self.class_token.expand(x.shape[0], -1, -1), patches], dim=1)
        logits: torch.Tensor = self.heads(self.encoder(tokens)[:, 0])
        return logits
