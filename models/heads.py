"""Heads a method puts on a zoo model in place of its linear one, which
``build_model(..., head={...})`` rebuilds (hfl-export, hfl-eval: a checkpoint's
model description names it)."""

from __future__ import annotations

import torch
from torch import nn


class ProtoHead(nn.Module):
    """Projection ``u = proj(f)`` to the prototype space, whose L2-normalised
    ``z = u / ||u||`` the prototypes and the contrastive loss use, and the decision
    head on ``u`` (or on ``z`` with ``normalize_decision``)."""

    def __init__(self, embedding_dim: int, proto_dim: int, num_classes: int, layers: int = 1,
                 normalize_decision: bool = False):
        super().__init__()
        self.normalize_decision = normalize_decision
        self.proj = nn.Linear(embedding_dim, proto_dim)
        blocks: list[nn.Module] = []
        for _ in range(layers - 1):
            blocks += [nn.Linear(proto_dim, proto_dim), nn.ReLU()]
        self.decision = nn.Sequential(*blocks, nn.Linear(proto_dim, num_classes))

    def parts(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z (B, d) unit norm, logits (B, C))."""
        u = self.proj(feats)
        z = nn.functional.normalize(u, dim=1)
        return z, self.decision(z if self.normalize_decision else u)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.parts(feats)[1]  # (B, C)


def build_head(embedding_dim: int, num_classes: int, spec: dict) -> nn.Module:
    """The head ``spec`` names: ``{"kind": "proto", "proto_dim", "layers",
    "normalize_decision"}`` (FedHP's :class:`ProtoHead`)."""
    if not isinstance(spec, dict) or spec.get("kind") != "proto":
        raise ValueError(f"head: got {spec!r}; allowed: {{kind: proto, proto_dim, layers, "
                         "normalize_decision}}")
    params = {k: v for k, v in spec.items() if k != "kind"}
    unknown = sorted(set(params) - {"proto_dim", "layers", "normalize_decision"})
    if unknown:
        raise ValueError(f"head: unknown field(s) {', '.join(unknown)}; allowed: proto_dim, "
                         "layers, normalize_decision")
    dim, layers = params.get("proto_dim"), params.get("layers", 1)
    decide_on_z = params.get("normalize_decision", False)
    for name, value, top in (("proto_dim", dim, 65536), ("layers", layers, 16)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"head: {name} must be an int from 1 to {top}, got {value!r}")
    if not isinstance(decide_on_z, bool):
        raise ValueError(f"head: normalize_decision must be true or false, got {decide_on_z!r}")
    return ProtoHead(embedding_dim, dim, num_classes, layers, decide_on_z)
